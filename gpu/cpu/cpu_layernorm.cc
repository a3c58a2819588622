// LayerNorm forward and backward (eps 1e-5, as GPT-2).
#include <cmath>

#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

constexpr float kEps = 1e-5f;

TROUPE_CLONES void layernorm_row(float* out, float* mean_out, float* rstd_out, const float* x,
                                 const float* w, const float* b, i64 C) {
  const float m = row_sum(x, C) / static_cast<float>(C);
  const float var = row_sq_dev(x, m, C) / static_cast<float>(C);
  const float s = 1.0f / std::sqrt(var + kEps);
  for (i64 i = 0; i < C; i++) out[i] = (x[i] - m) * s * w[i] + b[i];
  *mean_out = m;
  *rstd_out = s;
}

// dinp for one row: dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))
// with dnorm = w * dout.
TROUPE_CLONES void layernorm_backward_row(float* dinp, const float* dout, const float* x,
                                          const float* w, float m, float s, i64 C) {
  float acc_d[kLanes] = {}, acc_dn[kLanes] = {};
  i64 j = 0;
  for (; j + kLanes <= C; j += kLanes) {
    for (int k = 0; k < kLanes; k++) {
      const float dnorm = w[j + k] * dout[j + k];
      acc_d[k] += dnorm;
      acc_dn[k] += dnorm * ((x[j + k] - m) * s);
    }
  }
  for (; j < C; j++) {
    const float dnorm = w[j] * dout[j];
    acc_d[j % kLanes] += dnorm;
    acc_dn[j % kLanes] += dnorm * ((x[j] - m) * s);
  }
  const float dnorm_mean = combine_lanes(acc_d) / static_cast<float>(C);
  const float dnorm_norm_mean = combine_lanes(acc_dn) / static_cast<float>(C);
  for (i64 i = 0; i < C; i++) {
    float norm = (x[i] - m) * s;
    float dnorm = w[i] * dout[i];
    dinp[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// dw, db for columns [c0, c1), rows in order (independent of the team size).
TROUPE_CLONES void layernorm_param_grads(float* dw, float* db, const float* dout, const float* inp,
                                         const float* mean, const float* rstd, i64 N, i64 C, i64 c0,
                                         i64 c1) {
  for (i64 n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float m = mean[n], s = rstd[n];
    for (i64 i = c0; i < c1; i++) {
      dw[i] += (x[i] - m) * s * d[i];
      db[i] += d[i];
    }
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, i64 N, i64 C) {
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; n++) {
    layernorm_row(out + n * C, mean + n, rstd + n, inp + n * C, w, b, C);
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, i64 N, i64 C) {
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; n++) {
    layernorm_backward_row(dinp + n * C, dout + n * C, inp + n * C, w, mean[n], rstd[n], C);
  }
  constexpr i64 kCols = 32;
#pragma omp parallel for schedule(static)
  for (i64 c0 = 0; c0 < C; c0 += kCols) {
    layernorm_param_grads(dw, db, dout, inp, mean, rstd, N, C, c0, c0 + kCols < C ? c0 + kCols : C);
  }
}

}  // namespace troupe::gpu::cpu
