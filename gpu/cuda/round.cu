// round_to: an fp32 tensor's values rounded to bf16 or fp16, as mixed
// precision stores them (gpu/precision.h). Kernel, then launcher.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/cuda/cuda_common.cuh"

namespace troupe::gpu::cuda {
namespace {

constexpr int kBlock = 256;

// Round-to-nearest-even conversions there and back: exact inverses on the
// way back, so the value is the nearest representable one (fp16 overflow
// gives inf, NaN stays NaN).
template <Precision P>
__global__ void round_kernel(const unsigned* fault, float* out, const float* in, i64 n) {
  if (faulted(fault)) return;
  for (i64 i = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<i64>(gridDim.x) * blockDim.x) {
    const float x = in[i];
    if constexpr (P == Precision::kBf16) {
      out[i] = __bfloat162float(__float2bfloat16_rn(x));
    } else if constexpr (P == Precision::kFp16) {
      out[i] = __half2float(__float2half_rn(x));
    } else {
      out[i] = x;
    }
  }
}

}  // namespace

cudaError_t round_to(const Launch& at, float* out, const float* in, i64 n, Precision p) {
  if (n == 0 || (p == Precision::kFp32 && out == in)) return cudaSuccess;
  const int grid = grid_for(n, kBlock);
  switch (p) {
    case Precision::kBf16:
      round_kernel<Precision::kBf16><<<grid, kBlock, 0, at.stream>>>(at.fault, out, in, n);
      break;
    case Precision::kFp16:
      round_kernel<Precision::kFp16><<<grid, kBlock, 0, at.stream>>>(at.fault, out, in, n);
      break;
    case Precision::kFp32:
      round_kernel<Precision::kFp32><<<grid, kBlock, 0, at.stream>>>(at.fault, out, in, n);
      break;
  }
  return cudaGetLastError();
}

}  // namespace troupe::gpu::cuda
