// GELU (GPT-2's tanh approximation) forward and backward: elementwise maps
// (elementwise.cuh: a thread owns 16 bytes of each operand per step, as
// Packed128 loads and stores; fp32 in registers). Forward moves 2 elements
// per element of n, backward 3. Ops, then launchers.
#include "gpu/cuda/elementwise.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

struct GeluForward {
  __device__ float operator()(float x) const {
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};

// dinp = gelu'(x) * dout
struct GeluBackward {
  __device__ float operator()(float x, float dout) const {
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    return (0.5f * (1.0f + th) + 0.5f * x * sech2 * du) * dout;
  }
};

}  // namespace

cudaError_t gelu_forward(const Launch& at, Precision p, void* out, const void* inp, i64 n) {
  return map(at, p, out, n, GeluForward{}, inp);
}

cudaError_t gelu_backward(const Launch& at, Precision p, void* dinp, const void* inp,
                          const void* dout, i64 n) {
  return map(at, p, dinp, n, GeluBackward{}, inp, dout);
}

}  // namespace troupe::gpu::cuda
