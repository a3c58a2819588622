// Token + position embedding on a vocabulary slice (gpu/kernels.h
// VocabSlice): forward and backward. Kernels, then launchers.
//
// Both check every token first (one kernel): an id outside [0, total) is a
// fault of the op, and the op writes nothing. The backward is deterministic:
// a thread owns a column and walks the tokens in order, so a row hit by
// several tokens sums them in the same order on every run, as on the CPU.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void embedding_forward_kernel(const unsigned* fault, float* out,
                                         const std::int32_t* tokens, const float* wte,
                                         const float* wpe, i64 BT, i64 T, i64 C, i64 rows,
                                         i64 begin) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < BT * C;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 bt = i / C, c = i % C;
    const i64 row = static_cast<i64>(tokens[bt]) - begin;
    const float p = wpe[(bt % T) * C + c];
    // Another rank's token contributes 0 here; its row adds in the all-reduce.
    out[i] = row >= 0 && row < rows ? wte[row * C + c] + p : p;
  }
}

// dwte: thread c walks all tokens in order.
__global__ void embedding_backward_wte_kernel(const unsigned* fault, float* dwte, const float* dout,
                                              const std::int32_t* tokens, i64 BT, i64 C, i64 rows,
                                              i64 begin) {
  if (faulted(fault)) return;
  const i64 c = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (i64 bt = 0; bt < BT; bt++) {
    const i64 row = static_cast<i64>(tokens[bt]) - begin;
    if (row >= 0 && row < rows) dwte[row * C + c] += dout[bt * C + c];
  }
}

// dwpe[t, c]: thread (t, c) sums over the batch in order.
__global__ void embedding_backward_wpe_kernel(const unsigned* fault, float* dwpe, const float* dout,
                                              i64 B, i64 T, i64 C) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * C;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    float s = dwpe[i];
    for (i64 b = 0; b < B; b++) s += dout[b * T * C + i];
    dwpe[i] = s;
  }
}

}  // namespace

cudaError_t embedding_forward(const Launch& at, float* out, const std::int32_t* tokens,
                              const float* wte, const float* wpe, i64 B, i64 T, i64 C, i64 rows,
                              i64 begin, i64 total) {
  const i64 BT = B * T;
  if (BT == 0) return cudaSuccess;
  cudaError_t err = check_indices(at, Fault::kEmbeddingForwardToken, tokens, BT, total);
  if (err != cudaSuccess || C == 0) return err;
  embedding_forward_kernel<<<grid_for(BT * C, kBlock), kBlock, 0, at.stream>>>(
      at.fault, out, tokens, wte, wpe, BT, T, C, rows, begin);
  return cudaGetLastError();
}

cudaError_t embedding_backward(const Launch& at, float* dwte, float* dwpe, const float* dout,
                               const std::int32_t* tokens, i64 B, i64 T, i64 C, i64 rows, i64 begin,
                               i64 total) {
  const i64 BT = B * T;
  if (BT == 0) return cudaSuccess;
  cudaError_t err = check_indices(at, Fault::kEmbeddingBackwardToken, tokens, BT, total);
  if (err != cudaSuccess || C == 0) return err;
  embedding_backward_wte_kernel<<<static_cast<unsigned>((C + kBlock - 1) / kBlock), kBlock, 0,
                                  at.stream>>>(at.fault, dwte, dout, tokens, BT, C, rows, begin);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  embedding_backward_wpe_kernel<<<grid_for(T * C, kBlock), kBlock, 0, at.stream>>>(at.fault, dwpe,
                                                                                   dout, B, T, C);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
