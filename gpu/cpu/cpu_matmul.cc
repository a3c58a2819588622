// Linear layers on oneDNN's sgemm (it dispatches on the CPU's ISA and runs
// on the calling thread's OpenMP team).
#include <oneapi/dnnl/dnnl.h>

#include <cstdio>
#include <stdexcept>

#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

// dbias[o] += sum_n dout[n, o] for o in [o0, o1): rows in order, so the sum
// does not depend on the thread count.
TROUPE_CLONES void colsum_range(float* dbias, const float* dout, i64 N, i64 OC, i64 o0, i64 o1) {
  for (i64 n = 0; n < N; n++) {
    const float* row = dout + n * OC;
    for (i64 o = o0; o < o1; o++) dbias[o] += row[o];
  }
}

TROUPE_CLONES void broadcast_rows(float* out, const float* bias, i64 rows, i64 OC) {
  for (i64 n = 0; n < rows; n++) {
    for (i64 o = 0; o < OC; o++) out[n * OC + o] = bias[o];
  }
}

}  // namespace

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
  // dw[OC,IC] += dout^T . inp
  sgemm('T', 'N', OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
  if (dbias != nullptr) {
    constexpr i64 kCols = 64;
#pragma omp parallel for schedule(static)
    for (i64 o0 = 0; o0 < OC; o0 += kCols) {
      colsum_range(dbias, dout, N, OC, o0, o0 + kCols < OC ? o0 + kCols : OC);
    }
  }
}

}  // namespace troupe::gpu::cpu
