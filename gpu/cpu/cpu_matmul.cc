// Linear layers on oneDNN: fp32 through its sgemm, bf16 through its bf16
// matmul primitive (it dispatches on the CPU's ISA: AMX, AVX512-BF16, or
// its AVX-512 emulation; both run on the calling thread's OpenMP team).
#include <oneapi/dnnl/dnnl.h>

#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "gpu/cpu/cpu_convert.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

// dbias[o] += sum_n dout[n, o] for o in [o0, o1): rows in order, so the sum
// does not depend on the thread count. One clone set per storage format.
template <typename S>
TROUPE_INLINE void colsum_body(float* dbias, const void* dout_, i64 N, i64 OC, i64 o0, i64 o1) {
  const auto* dout = static_cast<const typename S::T*>(dout_);
  for (i64 n = 0; n < N; n++) {
    const typename S::T* row = dout + n * OC;
    for (i64 o = o0; o < o1; o++) dbias[o] += S::load(row[o]);
  }
}
#define TROUPE_COLSUM(S)                                                                         \
  TROUPE_CLONES void colsum_##S(float* dbias, const void* dout, i64 N, i64 OC, i64 o0, i64 o1) { \
    colsum_body<S>(dbias, dout, N, OC, o0, o1);                                                  \
  }
TROUPE_COLSUM(F32)
TROUPE_COLSUM(BF16)
TROUPE_COLSUM(F16)
#undef TROUPE_COLSUM

TROUPE_CLONES void broadcast_rows(float* out, const float* bias, i64 rows, i64 OC) {
  for (i64 n = 0; n < rows; n++) {
    for (i64 o = 0; o < OC; o++) out[n * OC + o] = bias[o];
  }
}

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// A [rows, cols] matrix at `data` whose element (i, j) is at i * rs + j * cs.
struct Operand {
  const void* data;
  i64 rows, cols, rs, cs;
  memory::data_type dt;
  memory::desc desc() const { return memory::desc({rows, cols}, dt, {rs, cs}); }
};

// C (=|+=) A . B (+ bias[1, N]) on oneDNN's matmul: fp32 accumulation, C
// rounded once. The primitive comes from oneDNN's own cache by shape.
dnnl::matmul::primitive_desc gemm_desc(const Operand& a, const Operand& b, const Operand& c,
                                       memory::data_type bias_dt, bool accumulate) {
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  const memory::desc bias_md = bias_dt == memory::data_type::undef
                                   ? memory::desc()
                                   : memory::desc({1, c.cols}, bias_dt, {c.cols, 1});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a.desc(), b.desc(), bias_md, c.desc()),
                                      attr, engine());
}

void gemm(const Operand& a, const Operand& b, const Operand& c, const void* bias, bool accumulate) {
  if (c.rows == 0 || c.cols == 0) return;
  const memory::data_type bias_dt = bias != nullptr ? a.dt : memory::data_type::undef;
  const dnnl::matmul::primitive_desc pd = gemm_desc(a, b, c, bias_dt, accumulate);
  auto mem = [](const memory::desc& md, const void* p) {
    return memory(md, engine(), const_cast<void*>(p));
  };
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, mem(pd.src_desc(), a.data)},
                                          {DNNL_ARG_WEIGHTS, mem(pd.weights_desc(), b.data)},
                                          {DNNL_ARG_DST, mem(pd.dst_desc(), c.data)}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, mem(pd.bias_desc(), bias));
  dnnl::stream strm(engine());
  dnnl::matmul(pd).execute(strm, args);
  strm.wait();
}

constexpr memory::data_type kBf16 = memory::data_type::bf16;
constexpr memory::data_type kF32 = memory::data_type::f32;

}  // namespace

bool bf16_matmul_native() {
  static const bool native = [] {
    const char* force = std::getenv("TROUPE_CPU_BF16_GEMM");
    if (force != nullptr && std::string(force) == "fp32") return false;  // (tests the fallback)
    // The three layouts the linear layers use (transposed weights with a
    // bias; plain; a transposed source into f32, added to): each must have
    // an implementation other than oneDNN's reference loop.
    const i64 n = 64;
    const Operand plain{nullptr, n, n, n, 1, kBf16}, transposed{nullptr, n, n, 1, n, kBf16};
    const Operand out{nullptr, n, n, n, 1, kBf16}, main_grad{nullptr, n, n, n, 1, kF32};
    auto not_ref = [](const dnnl::matmul::primitive_desc& pd) {
      return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    };
    const memory::data_type none = memory::data_type::undef;
    try {
      return not_ref(gemm_desc(plain, transposed, out, kBf16, false)) &&
             not_ref(gemm_desc(plain, plain, out, none, true)) &&
             not_ref(gemm_desc(transposed, plain, main_grad, none, true));
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

void matmul_forward_bf16(void* out, const void* inp, const void* w, const void* bias, i64 N, i64 IC,
                         i64 OC) {
  // out[N,OC] = inp[N,IC] . w^T, w^T[IC,OC] read from w[OC,IC] by strides.
  gemm({inp, N, IC, IC, 1, kBf16}, {w, IC, OC, 1, IC, kBf16}, {out, N, OC, OC, 1, kBf16}, bias,
       false);
}

void matmul_backward_bf16(void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                          const void* w, i64 N, i64 IC, i64 OC, bool accumulate_dinp) {
  // dinp[N,IC] (=|+=) dout[N,OC] . w[OC,IC]
  gemm({dout, N, OC, OC, 1, kBf16}, {w, OC, IC, IC, 1, kBf16}, {dinp, N, IC, IC, 1, kBf16}, nullptr,
       accumulate_dinp);
  if (dw != nullptr) matmul_backward_weight_bf16(dw, dout, inp, N, IC, OC);
  if (dbias != nullptr) bias_backward(dbias, dout, DType::kBF16, N, OC);
}

void matmul_backward_weight_bf16(float* dw, const void* dout, const void* inp, i64 N, i64 IC,
                                 i64 OC) {
  // dw[OC,IC] += dout^T . inp: the fp32 main gradient, added into.
  gemm({dout, OC, N, 1, OC, kBf16}, {inp, N, IC, IC, 1, kBf16}, {dw, OC, IC, IC, 1, kF32}, nullptr,
       true);
}

void bias_backward(float* dbias, const void* dout, DType dt, i64 N, i64 OC) {
  constexpr i64 kCols = 64;  // a thread's columns: 256 bytes of each fp32 row
#pragma omp parallel for schedule(static)
  for (i64 o0 = 0; o0 < OC; o0 += kCols) {
    const i64 o1 = o0 + kCols < OC ? o0 + kCols : OC;
    switch (dt) {
      case DType::kBF16:
        colsum_BF16(dbias, dout, N, OC, o0, o1);
        break;
      case DType::kF16:
        colsum_F16(dbias, dout, N, OC, o0, o1);
        break;
      default:
        colsum_F32(dbias, dout, N, OC, o0, o1);
    }
  }
}

void sgemm(char transa, char transb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda,
           const float* B, i64 ldb, float beta, float* C, i64 ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st = dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success) {
    // Shapes are checked by gpu/ops.cc, so this is a bug; the stream turns the
    // exception into an Internal error.
    char msg[160];
    std::snprintf(msg, sizeof msg, "dnnl_sgemm(%c,%c,M=%ld,N=%ld,K=%ld) failed with status %d",
                  transa, transb, static_cast<long>(M), static_cast<long>(N), static_cast<long>(K),
                  static_cast<int>(st));
    throw std::runtime_error(msg);
  }
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, i64 N, i64 IC,
                    i64 OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
    // out = bias, then out += inp . w^T in the GEMM (beta = 1): one pass fewer
    // than adding the bias afterwards.
    constexpr i64 kRows = 64;
#pragma omp parallel for schedule(static)
    for (i64 n0 = 0; n0 < N; n0 += kRows) {
      broadcast_rows(out + n0 * OC, bias, (n0 + kRows < N ? kRows : N - n0), OC);
    }
    beta = 1.0f;
  }
  sgemm('N', 'T', N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, i64 N, i64 IC, i64 OC, bool accumulate_dinp) {
  // dinp[N,IC] = dout[N,OC] . w[OC,IC]
  sgemm('N', 'N', N, IC, OC, 1.0f, dout, OC, w, IC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
  if (dw != nullptr) matmul_backward_weight(dw, dout, inp, N, IC, OC);
  if (dbias != nullptr) bias_backward(dbias, dout, DType::kF32, N, OC);
}

void matmul_backward_weight(float* dw, const float* dout, const float* inp, i64 N, i64 IC, i64 OC) {
  // dw[OC,IC] += dout^T . inp
  sgemm('T', 'N', OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
}

}  // namespace troupe::gpu::cpu
