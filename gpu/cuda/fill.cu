// fill (x[:] = value) and axpy (y += alpha * x) on tensors of the compute
// dtype: elementwise maps (elementwise.cuh: a thread owns 16 bytes of each
// operand per step, as Packed128 loads and stores). fill writes 1 element
// per element of n, axpy moves 3 (y read and written in place, each element
// by the one thread that owns it). Ops, then launchers.
#include "gpu/cuda/elementwise.cuh"

namespace troupe::gpu::cuda {
namespace {

struct Fill {
  float value;
  __device__ float operator()() const { return value; }
};

struct Axpy {
  float alpha;
  __device__ float operator()(float y, float x) const { return fmaf(alpha, x, y); }
};

}  // namespace

cudaError_t fill(const Launch& at, Precision p, void* x, float value, i64 n) {
  return map(at, p, x, n, Fill{value});
}

cudaError_t axpy(const Launch& at, Precision p, void* y, float alpha, const void* x, i64 n) {
  return map(at, p, y, n, Axpy{alpha}, static_cast<const void*>(y), x);
}

}  // namespace troupe::gpu::cuda
