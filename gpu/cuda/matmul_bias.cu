// The bias of a linear layer where cuBLASLt's epilogue cannot add it, and its
// gradient: dbias[o] += sum over rows of dout[:, o], a thread per column
// walking the rows in order (deterministic). The GEMMs of matmul
// forward/backward are cuBLASLt calls (matmul.cc).
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void bias_grad_kernel(const unsigned* fault, float* dbias, const float* dout, i64 N,
                                 i64 OC) {
  if (faulted(fault)) return;
  const i64 o = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x;
  if (o >= OC) return;
  float s = dbias[o];
  for (i64 n = 0; n < N; n++) s += dout[n * OC + o];
  dbias[o] = s;
}

__global__ void bias_add_kernel(const unsigned* fault, float* out, const float* bias, i64 N,
                                i64 OC) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N * OC;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    out[i] += bias[i % OC];
  }
}

}  // namespace

cudaError_t bias_add(const Launch& at, float* out, const float* bias, i64 N, i64 OC) {
  if (N == 0 || OC == 0) return cudaSuccess;
  bias_add_kernel<<<grid_for(N * OC, kBlock), kBlock, 0, at.stream>>>(at.fault, out, bias, N, OC);
  return cudaGetLastError();
}

cudaError_t bias_grad(const Launch& at, float* dbias, const float* dout, i64 N, i64 OC) {
  if (N == 0 || OC == 0) return cudaSuccess;
  bias_grad_kernel<<<static_cast<unsigned>((OC + kBlock - 1) / kBlock), kBlock, 0, at.stream>>>(
      at.fault, dbias, dout, N, OC);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
