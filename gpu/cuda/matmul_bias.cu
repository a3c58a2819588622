// The bias of a linear layer where cuBLASLt's epilogue cannot add it, and its
// gradient: dbias[o] += sum over rows of dout[:, o], a column sum
// (column_sum.cuh, deterministic). The GEMMs of matmul
// forward/backward are cuBLASLt calls (matmul.cc).
#include "gpu/cuda/column_sum.cuh"
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

struct Column {  // dout[n, o]
  const float* dout;
  i64 OC;
  __device__ float operator()(i64 n, i64 o) const { return dout[n * OC + o]; }
};

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

cudaError_t bias_grad(const Launch& at, float* dbias, const float* dout, i64 N, i64 OC,
                      float* scratch) {
  return column_sums(at, dbias, scratch, N, OC, Column{dout, OC});
}

}  // namespace troupe::gpu::cuda
