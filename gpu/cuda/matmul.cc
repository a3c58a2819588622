// matmul forward and backward: cuBLASLt GEMMs on row-major tensors.
//
// cuBLASLt is column-major; a row-major [R, K] matrix is its column-major
// transpose [K, R], so each row-major product is computed as the transposed
// column-major one (C = A . B^T row-major is C^T = B . A^T column-major).
// Alignment is taken from the actual pointers (views may start anywhere), so
// the heuristic never picks a kernel that assumes more.
#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gpu/cuda/cublaslt.h"
#include "gpu/cuda/cuda_matmul.h"

namespace troupe::gpu::cuda {
namespace {

absl::Status blas_status(const CublasLt& lt, cublasStatus_t st, absl::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", lt.GetStatusName(st), " (", lt.GetStatusString(st), ")"));
}

// (`lt`: the CublasLt table in scope.)
#define TROUPE_LT(call)                                      \
  do {                                                       \
    absl::Status troupe_st = blas_status(lt, (call), #call); \
    if (!troupe_st.ok()) return troupe_st;                   \
  } while (0)

// The largest power of two, up to 256, that divides the address.
std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 4 && a % al != 0) al /= 2;
  return al;
}

template <typename T, auto Destroy>  // Destroy: a member of CublasLt
struct LtHandle {
  const CublasLt& lt;
  T h = nullptr;
  ~LtHandle() {
    if (h != nullptr) (lt.*Destroy)(h);
  }
};
using OpDesc = LtHandle<cublasLtMatmulDesc_t, &CublasLt::MatmulDescDestroy>;
using Layout = LtHandle<cublasLtMatrixLayout_t, &CublasLt::MatrixLayoutDestroy>;
using Pref = LtHandle<cublasLtMatmulPreference_t, &CublasLt::MatmulPreferenceDestroy>;

struct Operand {
  const float* data;
  cublasOperation_t op;
  i64 rows, cols, ld;  // of the stored column-major matrix, before op
};

// D[m, n] (column-major, leading dimension ldd) = op(A) . op(B) + beta * D,
// plus bias[m] in the epilogue when bias is not null.
absl::Status lt_gemm(const Launch& at, const Gemm& g, const Operand& a, const Operand& b, i64 m,
                     i64 n, i64 k, float beta, float* d, i64 ldd, const float* bias) {
  if (g.api == nullptr) {
    return absl::FailedPreconditionError(
        "cuBLASLt is not open: the CUDA device was not initialised");
  }
  const CublasLt& lt = *g.api;
  OpDesc op{lt};
  TROUPE_LT(lt.MatmulDescCreate(&op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSA, &a.op, sizeof a.op));
  TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSB, &b.op, sizeof b.op));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    TROUPE_LT(
        lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  Layout la{lt}, lb{lt}, ld{lt};
  TROUPE_LT(lt.MatrixLayoutCreate(&la.h, CUDA_R_32F, static_cast<std::uint64_t>(a.rows),
                                  static_cast<std::uint64_t>(a.cols), a.ld));
  TROUPE_LT(lt.MatrixLayoutCreate(&lb.h, CUDA_R_32F, static_cast<std::uint64_t>(b.rows),
                                  static_cast<std::uint64_t>(b.cols), b.ld));
  TROUPE_LT(lt.MatrixLayoutCreate(&ld.h, CUDA_R_32F, static_cast<std::uint64_t>(m),
                                  static_cast<std::uint64_t>(n), ldd));
  Pref pref{lt};
  TROUPE_LT(lt.MatmulPreferenceCreate(&pref.h));
  const std::uint64_t ws = g.workspace_bytes;
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws));
  const std::uint32_t align_a = alignment(a.data), align_b = alignment(b.data),
                      align_d = alignment(d);
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                            &align_a, sizeof align_a));
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                            &align_b, sizeof align_b));
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                            &align_d, sizeof align_d));
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                            &align_d, sizeof align_d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // No algorithm is either status: NOT_SUPPORTED (what cuBLASLt mostly
  // says; PyTorch checks both) or success with none found.
  const cublasStatus_t heuristic =
      lt.MatmulAlgoGetHeuristic(g.lt, op.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &result, &found);
  if (heuristic != CUBLAS_STATUS_NOT_SUPPORTED) {
    TROUPE_LT(heuristic);
  }
  if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) {
    return absl::NotFoundError(absl::StrCat("cuBLASLt has no algorithm for m=", m, " n=", n, " k=",
                                            k, bias != nullptr ? " with a bias epilogue" : ""));
  }
  const float alpha = 1.0f;
  TROUPE_LT(lt.Matmul(g.lt, op.h, &alpha, a.data, la.h, b.data, lb.h, &beta, d, ld.h, d, ld.h,
                      &result.algo, g.workspace, g.workspace_bytes, at.stream));
  return absl::OkStatus();
}

absl::Status launched(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

}  // namespace

// The bias goes in the GEMM's epilogue where cuBLASLt takes it (a 16-byte
// aligned vector and an algorithm for it); otherwise a kernel adds it after.
// (NotFound from the first try means nothing was enqueued.)
absl::Status matmul_forward(const Launch& at, const Gemm& g, float* out, const float* inp,
                            const float* w, const float* bias, i64 N, i64 IC, i64 OC) {
  if (N == 0 || OC == 0) return absl::OkStatus();
  // out^T[OC, N] = w[OC, IC] . inp^T[IC, N]: w is stored as [IC, OC], inp as [IC, N].
  const Operand a{w, CUBLAS_OP_T, IC, OC, IC}, b{inp, CUBLAS_OP_N, IC, N, IC};
  if (bias != nullptr && alignment(bias) >= 16) {
    absl::Status st = lt_gemm(at, g, a, b, OC, N, IC, 0.0f, out, OC, bias);
    if (!absl::IsNotFound(st)) return st;
  }
  absl::Status st = lt_gemm(at, g, a, b, OC, N, IC, 0.0f, out, OC, nullptr);
  if (!st.ok() || bias == nullptr) return st;
  return launched(bias_add(at, out, bias, N, OC), "bias_add");
}

absl::Status matmul_backward(const Launch& at, const Gemm& g, float* dinp, float* dw, float* dbias,
                             const float* dout, const float* inp, const float* w, i64 N, i64 IC,
                             i64 OC, bool accumulate_dinp, float* bias_scratch) {
  if (N == 0) return absl::OkStatus();
  if (OC == 0) {  // an empty sum: dinp is 0 (or unchanged), dw and dbias are empty
    if (accumulate_dinp) return absl::OkStatus();
    return launched(
        cudaMemsetAsync(dinp, 0, static_cast<std::size_t>(N * IC) * sizeof(float), at.stream),
        "cudaMemsetAsync");
  }
  // dinp^T[IC, N] = w^T[IC, OC] . dout^T[OC, N]
  absl::Status st = lt_gemm(at, g, {w, CUBLAS_OP_N, IC, OC, IC}, {dout, CUBLAS_OP_N, OC, N, OC}, IC,
                            N, OC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC, nullptr);
  if (!st.ok()) return st;
  // dw^T[IC, OC] += inp^T[IC, N] . dout[N, OC]
  st = lt_gemm(at, g, {inp, CUBLAS_OP_N, IC, N, IC}, {dout, CUBLAS_OP_T, OC, N, OC}, IC, OC, N,
               1.0f, dw, IC, nullptr);
  if (!st.ok() || dbias == nullptr) return st;
  return launched(bias_grad(at, dbias, dout, N, OC, bias_scratch), "bias_grad");
}

}  // namespace troupe::gpu::cuda
