// fill: x[i] = value. Kernel, then launcher.
#include <cuda_runtime.h>

#include <cstdint>

namespace troupe::gpu::cuda {

__global__ void fill_kernel(float* x, float value, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

// Returns the launch error (cudaSuccess when the kernel was enqueued).
cudaError_t launch_fill(float* x, float value, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kBlock = 256;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  const int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
  fill_kernel<<<grid, kBlock, 0, stream>>>(x, value, n);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
