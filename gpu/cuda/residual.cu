// residual_forward: out = a + b. Kernel, then launcher.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void residual_kernel(const unsigned* fault, float* out, const float* a, const float* b,
                                i64 n) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

}  // namespace

cudaError_t residual_forward(const Launch& at, float* out, const float* a, const float* b, i64 n) {
  if (n == 0) return cudaSuccess;
  residual_kernel<<<grid_for(n, kBlock), kBlock, 0, at.stream>>>(at.fault, out, a, b, n);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
