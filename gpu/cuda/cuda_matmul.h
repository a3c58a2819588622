// Linear layers on cuBLASLt (gpu/cuda/matmul.cc), row-major as the CPU
// backend's: out[N,OC] = inp[N,IC] . w[OC,IC]^T + bias (the bias in the
// GEMM's epilogue); dinp (=|+=) dout . w; dw += dout^T . inp; dbias +=
// colsum(dout) (matmul_bias.cu). fp32 in and out, computed in IEEE fp32
// (CUBLAS_COMPUTE_32F: no TF32), so results compare with the CPU's.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "gpu/cuda/cublaslt.h"
#include "gpu/cuda/cuda_launch.h"

namespace troupe::gpu::cuda {

// What a stream's GEMMs need: the device's cuBLASLt table and handle and
// the stream's own workspace (a workspace is never shared by two streams).
struct Gemm {
  const CublasLt* api = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

absl::Status matmul_forward(const Launch& at, const Gemm& g, float* out, const float* inp,
                            const float* w, const float* bias, i64 N, i64 IC, i64 OC);
absl::Status matmul_backward(const Launch& at, const Gemm& g, float* dinp, float* dw, float* dbias,
                             const float* dout, const float* inp, const float* w, i64 N, i64 IC,
                             i64 OC, bool accumulate_dinp, float* bias_scratch);

}  // namespace troupe::gpu::cuda
