// matmul forward and backward: cuBLASLt GEMMs on row-major tensors.
//
// cuBLASLt is column-major; a row-major [R, K] matrix is its column-major
// transpose [K, R], so each row-major product is computed as the transposed
// column-major one (C = A . B^T row-major is C^T = B . A^T column-major).
// Alignment is taken from the actual pointers (views may start anywhere), so
// the heuristic never picks a kernel that assumes more.
//
// Types: A and B are in the compute dtype (CUDA_R_32F, CUDA_R_16BF or
// CUDA_R_16F); D (= C, for beta) is too for out and dinp, and fp32 for dw,
// the main gradient, so a 16-bit step accumulates its weight gradients in
// fp32 without a rounding per micro-batch. Every GEMM computes in fp32
// (CUBLAS_COMPUTE_32F, or ..._FAST_TF32 for fp32 operands when Gemm::tf32)
// with fp32 alpha and beta; the bias epilogue's vector is in D's type.
//
// Algorithms: cuBLASLt's heuristic is asked once per problem (handle,
// shape, operations, types, compute type, leading dimensions, alignments,
// epilogue, whether beta is 0, workspace) and its answer, an algorithm or
// none, is kept in a process-wide map: a training step's GEMMs repeat the
// same few problems, and the query costs tens of microseconds of host time
// each. One answer per problem also means every stream runs the same
// algorithm for it.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

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

// The largest power of two, up to 256, that divides the address (a 16-bit
// element's may be 2).
std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

cudaDataType_t storage_type(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return CUDA_R_16BF;
    case Precision::kFp16:
      return CUDA_R_16F;
    case Precision::kFp32:
      break;
  }
  return CUDA_R_32F;
}

std::size_t storage_bytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

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
  const void* data;
  cublasOperation_t op;
  i64 rows, cols, ld;  // of the stored column-major matrix, before op
};

// What the GEMM's epilogue does after D = op(A) . op(B) + beta * D
// (column-major D[m, n]; the bias vectors have m elements, aux is [m, n]
// with leading dimension m):
//   kBias        D += bias
//   kGeluAuxBias aux = D + bias; D = gelu(aux)          (fc1's forward)
//   kGeluAux     aux = D;        D = gelu(aux)
//   kDGelu       D = gelu'(aux) * D
enum class Epilogue { kNone, kBias, kGeluAuxBias, kGeluAux, kDGelu };

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kNone:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::kBias:
      return " with a bias epilogue";
    case Epilogue::kGeluAuxBias:
      return " with a GELU_AUX_BIAS epilogue";
    case Epilogue::kGeluAux:
      return " with a GELU_AUX epilogue";
    case Epilogue::kDGelu:
      return " with a DGELU epilogue";
    case Epilogue::kNone:
      break;
  }
  return "";
}

// How often the GELU epilogues ran fused and how often their unfused
// sequence ran instead (gelu_epilogue_counts()).
std::atomic<std::int64_t> gelu_fused[2], gelu_unfused[2];  // [0] forward, [1] backward

void count_epilogue(Epilogue e, bool fused) {
  const int k = e == Epilogue::kDGelu ? 1 : 0;
  (fused ? gelu_fused : gelu_unfused)[k].fetch_add(1, std::memory_order_relaxed);
}

// D[m, n] (column-major, leading dimension ldd) = op(A) . op(B) + beta * D,
// then the epilogue.
struct GemmCall {
  Operand a, b;  // stored as ab_type
  i64 m, n, k;
  cudaDataType_t ab_type;
  cudaDataType_t d_type;  // D's, C's (D itself), aux's and the bias's
  float beta;
  void* d;
  i64 ldd;
  Epilogue epilogue = Epilogue::kNone;
  const void* bias = nullptr;  // kBias, kGeluAuxBias
  const void* aux = nullptr;   // the GELU epilogues' pre-activation [m, n], ld m
};

// What the heuristic's answer depends on.
struct AlgoKey {
  std::uintptr_t lt;
  i64 m, n, k, lda, ldb, ldd;
  cublasOperation_t opa, opb;
  cudaDataType_t ab_type, d_type;
  cublasComputeType_t compute;
  std::uint32_t align_a, align_b, align_d;
  Epilogue epilogue;
  std::uint32_t align_bias, align_aux;  // 0 where the epilogue has none
  bool beta;                            // beta != 0
  std::uint64_t workspace;

  auto tied() const {
    return std::tie(lt, m, n, k, lda, ldb, ldd, opa, opb, ab_type, d_type, compute, align_a,
                    align_b, align_d, epilogue, align_bias, align_aux, beta, workspace);
  }
  bool operator<(const AlgoKey& o) const { return tied() < o.tied(); }
};

struct Algo {
  bool found = false;  // false: cuBLASLt has none for the problem
  cublasLtMatmulAlgo_t algo{};
};

// The chosen algorithms (never destroyed: a device may be destroyed during
// static destruction and forget its handle's entries then).
struct AlgoCache {
  std::mutex mu;
  std::map<AlgoKey, Algo> algos;
};
AlgoCache& algo_cache() {
  static AlgoCache* cache = new AlgoCache;
  return *cache;
}

// Asks the heuristic for the best algorithm of the problem the descriptors
// describe (none: NOT_SUPPORTED, what cuBLASLt mostly says, PyTorch checks
// both, or success with none found).
absl::StatusOr<Algo> ask_heuristic(const CublasLt& lt, const Gemm& g, const AlgoKey& key,
                                   cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld) {
  Pref pref{lt};
  TROUPE_LT(lt.MatmulPreferenceCreate(&pref.h));
  const std::uint64_t ws = g.workspace_bytes;
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws));
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                            &key.align_a, sizeof key.align_a));
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                            &key.align_b, sizeof key.align_b));
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                            &key.align_d, sizeof key.align_d));
  TROUPE_LT(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                            &key.align_d, sizeof key.align_d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t heuristic =
      lt.MatmulAlgoGetHeuristic(g.lt, op, la, lb, ld, ld, pref.h, 1, &result, &found);
  if (heuristic != CUBLAS_STATUS_NOT_SUPPORTED) {
    TROUPE_LT(heuristic);
  }
  Algo a;
  a.found = heuristic != CUBLAS_STATUS_NOT_SUPPORTED && found > 0;
  if (a.found) a.algo = result.algo;
  return a;
}

// The cached answer for `key`, asking the heuristic on a miss. Two streams
// that miss together both ask; the first answer stored is the one used.
absl::StatusOr<Algo> choose_algo(const CublasLt& lt, const Gemm& g, const AlgoKey& key,
                                 cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                                 cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld) {
  AlgoCache& cache = algo_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    const auto it = cache.algos.find(key);
    if (it != cache.algos.end()) return it->second;
  }
  absl::StatusOr<Algo> asked = ask_heuristic(lt, g, key, op, la, lb, ld);
  if (!asked.ok()) return asked.status();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.algos.try_emplace(key, *asked).first->second;
}

absl::Status lt_gemm(const Launch& at, const Gemm& g, const GemmCall& c) {
  if (g.api == nullptr) {
    return absl::FailedPreconditionError(
        "cuBLASLt is not open: the CUDA device was not initialised");
  }
  const CublasLt& lt = *g.api;
  const cublasComputeType_t compute =
      c.ab_type == CUDA_R_32F && g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  OpDesc op{lt};
  TROUPE_LT(lt.MatmulDescCreate(&op.h, compute, CUDA_R_32F));
  TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSA, &c.a.op, sizeof c.a.op));
  TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSB, &c.b.op, sizeof c.b.op));
  if (c.epilogue != Epilogue::kNone) {
    const cublasLtEpilogue_t epi = lt_epilogue(c.epilogue);
    TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  }
  if (c.bias != nullptr) {
    TROUPE_LT(
        lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias));
  }
  if (c.aux != nullptr) {
    const std::int64_t aux_ld = c.m;
    TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux,
                                        sizeof c.aux));
    TROUPE_LT(lt.MatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                        sizeof aux_ld));
  }
  Layout la{lt}, lb{lt}, ld{lt};
  TROUPE_LT(lt.MatrixLayoutCreate(&la.h, c.ab_type, static_cast<std::uint64_t>(c.a.rows),
                                  static_cast<std::uint64_t>(c.a.cols), c.a.ld));
  TROUPE_LT(lt.MatrixLayoutCreate(&lb.h, c.ab_type, static_cast<std::uint64_t>(c.b.rows),
                                  static_cast<std::uint64_t>(c.b.cols), c.b.ld));
  TROUPE_LT(lt.MatrixLayoutCreate(&ld.h, c.d_type, static_cast<std::uint64_t>(c.m),
                                  static_cast<std::uint64_t>(c.n), c.ldd));
  const AlgoKey key{.lt = reinterpret_cast<std::uintptr_t>(g.lt),
                    .m = c.m,
                    .n = c.n,
                    .k = c.k,
                    .lda = c.a.ld,
                    .ldb = c.b.ld,
                    .ldd = c.ldd,
                    .opa = c.a.op,
                    .opb = c.b.op,
                    .ab_type = c.ab_type,
                    .d_type = c.d_type,
                    .compute = compute,
                    .align_a = alignment(c.a.data),
                    .align_b = alignment(c.b.data),
                    .align_d = alignment(c.d),
                    .epilogue = c.epilogue,
                    .align_bias = c.bias != nullptr ? alignment(c.bias) : 0u,
                    .align_aux = c.aux != nullptr ? alignment(c.aux) : 0u,
                    .beta = c.beta != 0.0f,
                    .workspace = g.workspace_bytes};
  absl::StatusOr<Algo> algo = choose_algo(lt, g, key, op.h, la.h, lb.h, ld.h);
  if (!algo.ok()) return algo.status();
  if (!algo->found) {
    return absl::NotFoundError(absl::StrCat("cuBLASLt has no algorithm for m=", c.m, " n=", c.n,
                                            " k=", c.k, epilogue_name(c.epilogue)));
  }
  const float alpha = 1.0f;
  TROUPE_LT(lt.Matmul(g.lt, op.h, &alpha, c.a.data, la.h, c.b.data, lb.h, &c.beta, c.d, ld.h, c.d,
                      ld.h, &algo->algo, g.workspace, g.workspace_bytes, at.stream));
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
absl::Status matmul_forward(const Launch& at, const Gemm& g, Precision p, void* out,
                            const void* inp, const void* w, const void* bias, i64 N, i64 IC,
                            i64 OC) {
  if (N == 0 || OC == 0) return absl::OkStatus();
  const cudaDataType_t t = storage_type(p);
  // out^T[OC, N] = w[OC, IC] . inp^T[IC, N]: w is stored as [IC, OC], inp as [IC, N].
  GemmCall call{.a = {w, CUBLAS_OP_T, IC, OC, IC},
                .b = {inp, CUBLAS_OP_N, IC, N, IC},
                .m = OC,
                .n = N,
                .k = IC,
                .ab_type = t,
                .d_type = t,
                .beta = 0.0f,
                .d = out,
                .ldd = OC};
  if (bias != nullptr && alignment(bias) >= 16) {
    call.epilogue = Epilogue::kBias;
    call.bias = bias;
    absl::Status st = lt_gemm(at, g, call);
    if (!absl::IsNotFound(st)) return st;
    call.epilogue = Epilogue::kNone;
    call.bias = nullptr;
  }
  absl::Status st = lt_gemm(at, g, call);
  if (!st.ok() || bias == nullptr) return st;
  return launched(bias_add(at, p, out, bias, N, OC), "bias_add");
}

namespace {

// dinp^T[IC, N] = w^T[IC, OC] . dout^T[OC, N] (+ beta dinp), in the compute
// dtype: the input gradient's GEMM.
GemmCall dinp_call(cudaDataType_t t, void* dinp, const void* dout, const void* w, i64 N, i64 IC,
                   i64 OC, float beta) {
  return {.a = {w, CUBLAS_OP_N, IC, OC, IC},
          .b = {dout, CUBLAS_OP_N, OC, N, OC},
          .m = IC,
          .n = N,
          .k = OC,
          .ab_type = t,
          .d_type = t,
          .beta = beta,
          .d = dinp,
          .ldd = IC};
}

// dw^T[IC, OC] += inp^T[IC, N] . dout[N, OC] into the fp32 main gradient,
// and dbias += colsum(dout): the weight gradients.
absl::Status weight_grads(const Launch& at, const Gemm& g, Precision p, float* dw, float* dbias,
                          const void* dout, const void* inp, i64 N, i64 IC, i64 OC,
                          float* bias_scratch) {
  if (dw == nullptr) {  // the input gradient alone (a pipeline's B): dbias only
    if (dbias == nullptr) return absl::OkStatus();
    return launched(bias_grad(at, p, dbias, dout, N, OC, bias_scratch), "bias_grad");
  }
  absl::Status st = lt_gemm(at, g,
                            {.a = {inp, CUBLAS_OP_N, IC, N, IC},
                             .b = {dout, CUBLAS_OP_T, OC, N, OC},
                             .m = IC,
                             .n = OC,
                             .k = N,
                             .ab_type = storage_type(p),
                             .d_type = CUDA_R_32F,
                             .beta = 1.0f,
                             .d = dw,
                             .ldd = IC});
  if (!st.ok() || dbias == nullptr) return st;
  return launched(bias_grad(at, p, dbias, dout, N, OC, bias_scratch), "bias_grad");
}

}  // namespace

absl::Status matmul_backward(const Launch& at, const Gemm& g, Precision p, void* dinp, float* dw,
                             float* dbias, const void* dout, const void* inp, const void* w, i64 N,
                             i64 IC, i64 OC, bool accumulate_dinp, float* bias_scratch) {
  if (N == 0) return absl::OkStatus();
  if (OC == 0) {  // an empty sum: dinp is 0 (or unchanged), dw and dbias are empty
    if (accumulate_dinp) return absl::OkStatus();
    return launched(
        cudaMemsetAsync(dinp, 0, static_cast<std::size_t>(N * IC) * storage_bytes(p), at.stream),
        "cudaMemsetAsync");
  }
  absl::Status st = lt_gemm(
      at, g, dinp_call(storage_type(p), dinp, dout, w, N, IC, OC, accumulate_dinp ? 1.0f : 0.0f));
  if (!st.ok()) return st;
  return weight_grads(at, g, p, dw, dbias, dout, inp, N, IC, OC, bias_scratch);
}

// GELU's epilogues need the aux matrix's leading dimension (OC forward, IC
// backward) to be a multiple of 8 and, as the bias, 16-byte aligned
// pointers; where cuBLASLt has no algorithm for the fused problem, the
// unfused sequence runs instead (NotFound from the first try means nothing
// was enqueued).
absl::Status matmul_gelu_forward(const Launch& at, const Gemm& g, Precision p, void* out, void* pre,
                                 const void* inp, const void* w, const void* bias, i64 N, i64 IC,
                                 i64 OC) {
  if (N == 0 || OC == 0) return absl::OkStatus();
  if (OC % 8 == 0 && alignment(pre) >= 16 && (bias == nullptr || alignment(bias) >= 16)) {
    // out^T[OC, N] = gelu(w[OC, IC] . inp^T[IC, N] + bias), pre^T the aux
    absl::Status st =
        lt_gemm(at, g,
                {.a = {w, CUBLAS_OP_T, IC, OC, IC},
                 .b = {inp, CUBLAS_OP_N, IC, N, IC},
                 .m = OC,
                 .n = N,
                 .k = IC,
                 .ab_type = storage_type(p),
                 .d_type = storage_type(p),
                 .beta = 0.0f,
                 .d = out,
                 .ldd = OC,
                 .epilogue = bias != nullptr ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux,
                 .bias = bias,
                 .aux = pre});
    if (!absl::IsNotFound(st)) {
      if (st.ok()) count_epilogue(Epilogue::kGeluAuxBias, true);
      return st;
    }
  }
  count_epilogue(Epilogue::kGeluAuxBias, false);
  absl::Status st = matmul_forward(at, g, p, pre, inp, w, bias, N, IC, OC);
  if (!st.ok()) return st;
  return launched(gelu_forward(at, p, out, pre, N * OC), "gelu_forward");
}

// fc's bias gradient is the fixed-order fp32 column sum of dpre (bias_grad),
// not cuBLASLt's DGELU_BGRAD: that one writes it in the output's 16-bit
// type (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER) and sums in its
// algorithm's order, where troupe's main gradients are fp32 and every
// parameter gradient's sum has one fixed order (an fp16 sum of a
// micro-batch's loss-scaled rows could overflow, too). It costs one more
// read of dpre.
absl::Status matmul_backward_gelu(const Launch& at, const Gemm& g, Precision p, void* dpre,
                                  float* dpre_bias, float* dw, float* dbias, const void* dout,
                                  const void* inp, const void* w, const void* pre, i64 N, i64 IC,
                                  i64 OC, float* bias_scratch) {
  if (N == 0) return absl::OkStatus();
  if (OC == 0) {  // dout . w is an empty sum: dpre is 0, and so is what it adds to dpre_bias
    return launched(
        cudaMemsetAsync(dpre, 0, static_cast<std::size_t>(N * IC) * storage_bytes(p), at.stream),
        "cudaMemsetAsync");
  }
  absl::Status st = weight_grads(at, g, p, dw, dbias, dout, inp, N, IC, OC, bias_scratch);
  if (!st.ok()) return st;
  GemmCall call = dinp_call(storage_type(p), dpre, dout, w, N, IC, OC, 0.0f);
  bool fused = false;
  if (IC % 8 == 0 && alignment(pre) >= 16) {
    // dpre = gelu'(pre) * (dout . w), GELU's derivative in the epilogue
    call.epilogue = Epilogue::kDGelu;
    call.aux = pre;
    st = lt_gemm(at, g, call);
    if (!st.ok() && !absl::IsNotFound(st)) return st;
    fused = st.ok();
  }
  count_epilogue(Epilogue::kDGelu, fused);
  if (!fused) {
    call.epilogue = Epilogue::kNone;
    call.aux = nullptr;
    st = lt_gemm(at, g, call);
    if (!st.ok()) return st;
    st = launched(gelu_backward(at, p, dpre, pre, dpre, N * IC), "gelu_backward");
    if (!st.ok()) return st;
  }
  if (dpre_bias == nullptr) return absl::OkStatus();
  return launched(bias_grad(at, p, dpre_bias, dpre, N, IC, bias_scratch), "bias_grad");
}

absl::Status matmul_backward_weight(const Launch& at, const Gemm& g, Precision p, float* dw,
                                    const void* dout, const void* inp, i64 N, i64 IC, i64 OC) {
  if (N == 0 || OC == 0) return absl::OkStatus();
  return weight_grads(at, g, p, dw, nullptr, dout, inp, N, IC, OC, nullptr);
}

GeluEpilogueCounts gelu_epilogue_counts() {
  return {.forward_fused = gelu_fused[0].load(std::memory_order_relaxed),
          .forward_unfused = gelu_unfused[0].load(std::memory_order_relaxed),
          .backward_fused = gelu_fused[1].load(std::memory_order_relaxed),
          .backward_unfused = gelu_unfused[1].load(std::memory_order_relaxed)};
}

void forget_gemm_algorithms(cublasLtHandle_t lt) {
  AlgoCache& cache = algo_cache();
  const auto h = reinterpret_cast<std::uintptr_t>(lt);
  std::lock_guard<std::mutex> lock(cache.mu);
  for (auto it = cache.algos.begin(); it != cache.algos.end();) {
    it = it->first.lt == h ? cache.algos.erase(it) : std::next(it);
  }
}

}  // namespace troupe::gpu::cuda
