// The bias of a linear layer where cuBLASLt's epilogue cannot add it, and its
// gradient: dbias[o] += sum over rows of dout[:, o], a column sum
// (column_sum.cuh, deterministic, fp32 into the fp32 main gradient). out,
// bias and dout are in the compute dtype (stored as S). The GEMMs of matmul
// forward/backward are cuBLASLt calls (matmul.cc).
#include "gpu/cuda/column_sum.cuh"
#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

template <typename S>
struct Column {  // dout[n, o]
  const S* dout;
  i64 OC;
  __device__ float operator()(i64 n, i64 o) const { return to_float(dout[n * OC + o]); }
};

// A thread per element of out[N, OC] (grid stride): out read and written
// once, bias read from cache. In 16 bits out was rounded by the GEMM
// already, so the result is rounded twice (the epilogue rounds once).
template <typename S>
__global__ void bias_add_kernel(const unsigned* fault, S* out, const S* bias, i64 N, i64 OC) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < N * OC;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    out[i] = from_float<S>(to_float(out[i]) + to_float(bias[i % OC]));
  }
}

}  // namespace

cudaError_t bias_add(const Launch& at, Precision p, void* out, const void* bias, i64 N, i64 OC) {
  if (N == 0 || OC == 0) return cudaSuccess;
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    bias_add_kernel<<<grid_for(N * OC, kBlock), kBlock, 0, at.stream>>>(
        at.fault, static_cast<S*>(out), static_cast<const S*>(bias), N, OC);
    return cudaGetLastError();
  });
}

cudaError_t bias_grad(const Launch& at, Precision p, float* dbias, const void* dout, i64 N, i64 OC,
                      float* scratch) {
  return with_storage(p, [&](auto s) {
    using S = typename decltype(s)::type;
    return column_sums(at, dbias, scratch, N, OC, Column<S>{static_cast<const S*>(dout), OC});
  });
}

}  // namespace troupe::gpu::cuda
