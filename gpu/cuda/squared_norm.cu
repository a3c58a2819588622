// squared_norm: out[0] = sum of x^2 in double. Two kernels: fixed chunks of
// x to partial sums (one block each), then one block over the partials; both
// reduce in a tree of fixed shape, so the result does not depend on
// scheduling. The partials live in scratch the stream holds with the op.
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;
constexpr i64 kChunk = kBlock * 16;  // elements per partial sum

__device__ double block_sum_double(double v) {
  __shared__ double shared[kWarp];
  return block_sum(v, shared);
}

__global__ void partial_squares_kernel(const unsigned* fault, double* partial, const float* x,
                                       i64 n) {
  if (faulted(fault)) return;
  const i64 begin = blockIdx.x * kChunk;
  const i64 end = begin + kChunk < n ? begin + kChunk : n;
  double s = 0.0;
  for (i64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double xi = x[i];
    s += xi * xi;
  }
  s = block_sum_double(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(const unsigned* fault, double* out, const double* partial,
                                    i64 chunks) {
  if (faulted(fault)) return;
  double s = 0.0;
  for (i64 i = threadIdx.x; i < chunks; i += blockDim.x) s += partial[i];
  s = block_sum_double(s);
  if (threadIdx.x == 0) out[0] = s;
}

}  // namespace

i64 squared_norm_partials(i64 n) { return (n + kChunk - 1) / kChunk; }

cudaError_t squared_norm(const Launch& at, double* out, const float* x, i64 n, double* partial) {
  const i64 chunks = squared_norm_partials(n);
  if (chunks > 0) {
    partial_squares_kernel<<<static_cast<unsigned>(chunks), kBlock, 0, at.stream>>>(at.fault,
                                                                                    partial, x, n);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  // With no chunks (n == 0) this writes 0.
  sum_partials_kernel<<<1, 1024, 0, at.stream>>>(at.fault, out, partial, chunks);
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
