// Token + position embedding on a vocabulary slice (gpu/kernels.h
// VocabSlice): forward and backward. Kernels, then launchers. wte, wpe and
// out (forward) and dout (backward) are in the compute dtype (stored as S); dwte and
// dwpe are the fp32 main gradients, added into.
//
// Both check every token first (one kernel): an id outside [0, total) is a
// fault of the op, and the op writes nothing. The backward is deterministic:
// a thread owns a column and walks the tokens in order, so a row hit by
// several tokens sums them in the same order on every run, as on the CPU.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

// A thread per element of out[BT, C] (grid stride): reads one element of
// wte and of wpe, writes one of out (3 * BT * C elements moved).
template <typename S>
__global__ void embedding_forward_kernel(const unsigned* fault, S* out, const std::int32_t* tokens,
                                         const S* wte, const S* wpe, i64 BT, i64 T, i64 C, i64 rows,
                                         i64 begin) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < BT * C;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 bt = i / C, c = i % C;
    const i64 row = static_cast<i64>(tokens[bt]) - begin;
    const float p = to_float(wpe[(bt % T) * C + c]);
    // Another rank's token contributes 0 here; its row adds in the all-reduce.
    out[i] = from_float<S>(row >= 0 && row < rows ? to_float(wte[row * C + c]) + p : p);
  }
}

// dwte: thread c walks all tokens in order (fp32 sums).
template <typename S>
__global__ void embedding_backward_wte_kernel(const unsigned* fault, float* dwte, const S* dout,
                                              const std::int32_t* tokens, i64 BT, i64 C, i64 rows,
                                              i64 begin) {
  if (faulted(fault)) return;
  const i64 c = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (i64 bt = 0; bt < BT; bt++) {
    const i64 row = static_cast<i64>(tokens[bt]) - begin;
    if (row >= 0 && row < rows) dwte[row * C + c] += to_float(dout[bt * C + c]);
  }
}

// dwpe[t, c]: thread (t, c) sums over the batch in order.
template <typename S>
__global__ void embedding_backward_wpe_kernel(const unsigned* fault, float* dwpe, const S* dout,
                                              i64 B, i64 T, i64 C) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < T * C;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    float s = dwpe[i];
    for (i64 b = 0; b < B; b++) s += to_float(dout[b * T * C + i]);
    dwpe[i] = s;
  }
}

}  // namespace

cudaError_t embedding_forward(const Launch& at, Precision p, void* out, const std::int32_t* tokens,
                              const void* wte, const void* wpe, i64 B, i64 T, i64 C, i64 rows,
                              i64 begin, i64 total) {
  const i64 BT = B * T;
  if (BT == 0) return cudaSuccess;
  cudaError_t err = check_indices(at, Fault::kEmbeddingForwardToken, tokens, BT, total);
  if (err != cudaSuccess || C == 0) return err;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    embedding_forward_kernel<<<grid_for(BT * C, kBlock), kBlock, 0, at.stream>>>(
        at.fault, static_cast<S*>(out), tokens, static_cast<const S*>(wte),
        static_cast<const S*>(wpe), BT, T, C, rows, begin);
    return cudaGetLastError();
  });
}

cudaError_t embedding_backward(const Launch& at, Precision p, float* dwte, float* dwpe,
                               const void* dout, const std::int32_t* tokens, i64 B, i64 T, i64 C,
                               i64 rows, i64 begin, i64 total) {
  const i64 BT = B * T;
  if (BT == 0) return cudaSuccess;
  cudaError_t err = check_indices(at, Fault::kEmbeddingBackwardToken, tokens, BT, total);
  if (err != cudaSuccess || C == 0) return err;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    const S* d = static_cast<const S*>(dout);
    embedding_backward_wte_kernel<<<static_cast<unsigned>((C + kBlock - 1) / kBlock), kBlock, 0,
                                    at.stream>>>(at.fault, dwte, d, tokens, BT, C, rows, begin);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    embedding_backward_wpe_kernel<<<grid_for(T * C, kBlock), kBlock, 0, at.stream>>>(at.fault, dwpe,
                                                                                     d, B, T, C);
    return cudaGetLastError();
  });
}

}  // namespace troupe::gpu::cuda
