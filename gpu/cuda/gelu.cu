// GELU (GPT-2's tanh approximation) forward and backward. Kernels, then
// launchers.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__global__ void gelu_forward_kernel(const unsigned* fault, float* out, const float* inp, i64 n) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

__global__ void gelu_backward_kernel(const unsigned* fault, float* dinp, const float* inp,
                                     const float* dout, i64 n) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = (0.5f * (1.0f + th) + 0.5f * x * sech2 * du) * dout[i];
  }
}

}  // namespace

cudaError_t gelu_forward(const Launch& at, float* out, const float* inp, i64 n) {
  if (n == 0) return cudaSuccess;
  gelu_forward_kernel<<<grid_for(n, kBlock), kBlock, 0, at.stream>>>(at.fault, out, inp, n);
  return cudaGetLastError();
}

cudaError_t gelu_backward(const Launch& at, float* dinp, const float* inp, const float* dout,
                          i64 n) {
  if (n == 0) return cudaSuccess;
  gelu_backward_kernel<<<grid_for(n, kBlock), kBlock, 0, at.stream>>>(at.fault, dinp, inp, dout, n);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
