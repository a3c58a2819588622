// Linear layers on cuBLASLt (gpu/cuda/matmul.cc), row-major as the CPU
// backend's: out[N,OC] = inp[N,IC] . w[OC,IC]^T + bias (the bias in the
// GEMM's epilogue); dinp (=|+=) dout . w; dw += dout^T . inp; dbias +=
// colsum(dout) (matmul_bias.cu).
//
// Dtypes (gpu/kernels.h): inp, w, bias, out, dout and dinp are in the
// compute dtype, stored as `p` says (fp32, bf16 or fp16); dw and dbias are
// the fp32 main gradients, added into. Every GEMM accumulates in fp32
// (CUBLAS_COMPUTE_32F, fp32 alpha and beta) and rounds its output once:
// 16-bit operands run on the tensor cores; fp32 ones in IEEE fp32 (no TF32,
// so results compare with the CPU's) unless Gemm::tf32 is set.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

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
  // fp32 GEMMs on the tensor cores in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32:
  // 10-bit mantissas in the products, fp32 sums): StreamOptions::tf32.
  bool tf32 = false;
};

absl::Status matmul_forward(const Launch& at, const Gemm& g, Precision p, void* out,
                            const void* inp, const void* w, const void* bias, i64 N, i64 IC,
                            i64 OC);
absl::Status matmul_backward(const Launch& at, const Gemm& g, Precision p, void* dinp, float* dw,
                             float* dbias, const void* dout, const void* inp, const void* w, i64 N,
                             i64 IC, i64 OC, bool accumulate_dinp, float* bias_scratch);

// dw += dout^T . inp alone: matmul_backward's weight GEMM (a pipeline's W).
absl::Status matmul_backward_weight(const Launch& at, const Gemm& g, Precision p, float* dw,
                                    const void* dout, const void* inp, i64 N, i64 IC, i64 OC);

// The MLP's fused pair (gpu/kernels.h matmul_gelu_forward and
// matmul_backward_gelu): GELU in cuBLASLt's epilogues (GELU_AUX_BIAS
// forward, its pre-activation the aux output; DGELU backward) where it has
// them, the unfused ops where not; fc's bias gradient is bias_grad's fp32
// column sum. `bias_scratch`: column_chunks(N) * max(IC, OC) floats.
absl::Status matmul_gelu_forward(const Launch& at, const Gemm& g, Precision p, void* out, void* pre,
                                 const void* inp, const void* w, const void* bias, i64 N, i64 IC,
                                 i64 OC);
absl::Status matmul_backward_gelu(const Launch& at, const Gemm& g, Precision p, void* dpre,
                                  float* dpre_bias, float* dw, float* dbias, const void* dout,
                                  const void* inp, const void* w, const void* pre, i64 N, i64 IC,
                                  i64 OC, float* bias_scratch);

// Calls of the pair, since the process began, whose GELU ran in the GEMM's
// epilogue (fused) or as a kernel after it (unfused): how a test on a GPU
// sees which path ran.
struct GeluEpilogueCounts {
  std::int64_t forward_fused, forward_unfused, backward_fused, backward_unfused;
};
GeluEpilogueCounts gelu_epilogue_counts();

// Drops the algorithms matmul.cc chose for handle `lt` (see there): called
// before the handle is destroyed, so a later handle at the same address
// does not find them.
void forget_gemm_algorithms(cublasLtHandle_t lt);

}  // namespace troupe::gpu::cuda
