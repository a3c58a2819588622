// fill (x[:] = value) and axpy (y += alpha * x). Kernels, then launchers.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void fill_kernel(const unsigned* fault, float* x, float value, i64 n) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

__global__ void axpy_kernel(const unsigned* fault, float* y, float alpha, const float* x, i64 n) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    y[i] = fmaf(alpha, x[i], y[i]);
  }
}

}  // namespace

cudaError_t fill(const Launch& at, float* x, float value, i64 n) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<grid_for(n, kBlock), kBlock, 0, at.stream>>>(at.fault, x, value, n);
  return cudaGetLastError();
}

cudaError_t axpy(const Launch& at, float* y, float alpha, const float* x, i64 n) {
  if (n == 0) return cudaSuccess;
  axpy_kernel<<<grid_for(n, kBlock), kBlock, 0, at.stream>>>(at.fault, y, alpha, x, n);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
