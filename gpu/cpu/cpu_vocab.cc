// Ops over the vocabulary: token + position embedding, and the cross-entropy
// of the LM head over a padded vocabulary (only the first V of Vp columns take
// part, so the padding never changes a result).
#include <cmath>

#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

TROUPE_CLONES void add_rows(float* out, const float* a, const float* b, i64 C) {
  for (i64 i = 0; i < C; i++) out[i] = a[i] + b[i];
}

TROUPE_CLONES void accumulate_range(float* dst, const float* src, i64 c0, i64 c1) {
  for (i64 i = c0; i < c1; i++) dst[i] += src[i];
}

// log(sum_j exp(x[j])) over j < V, computed as max + log(sum exp(x - max)).
TROUPE_CLONES float logsumexp_row(const float* x, i64 V) {
  const float m = row_max(x, V);
  return m + std::log(row_sum_exp(x, m, V));
}

TROUPE_CLONES void crossentropy_grad_row(float* d, const float* x, float lse, float dloss, i64 V,
                                         i64 Vp) {
  for (i64 j = 0; j < V; j++) d[j] = exp_approx(x[j] - lse) * dloss;
  for (i64 j = V; j < Vp; j++) d[j] = 0.0f;
}

bool tokens_in_range(const std::int32_t* tokens, i64 n, i64 limit) {
  for (i64 i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= limit) return false;
  }
  return true;
}

}  // namespace

bool embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       i64 B, i64 T, i64 C, i64 Vp) {
  if (!tokens_in_range(tokens, B * T, Vp)) return false;
#pragma omp parallel for schedule(static)
  for (i64 bt = 0; bt < B * T; bt++) {
    add_rows(out + bt * C, wte + static_cast<i64>(tokens[bt]) * C, wpe + (bt % T) * C, C);
  }
  return true;
}

bool embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        i64 B, i64 T, i64 C, i64 Vp) {
  if (!tokens_in_range(tokens, B * T, Vp)) return false;
  // Each thread owns a range of columns and walks the tokens in order, so a
  // row hit by several tokens sums them in the same order on any team size.
  constexpr i64 kCols = 16;
#pragma omp parallel for schedule(static)
  for (i64 c0 = 0; c0 < C; c0 += kCols) {
    const i64 c1 = c0 + kCols < C ? c0 + kCols : C;
    for (i64 bt = 0; bt < B * T; bt++) {
      const float* d = dout + bt * C;
      accumulate_range(dwte + static_cast<i64>(tokens[bt]) * C, d, c0, c1);
      accumulate_range(dwpe + (bt % T) * C, d, c0, c1);
    }
  }
  return true;
}

bool crossentropy_forward(float* losses, float* lse, const float* logits,
                          const std::int32_t* targets, i64 N, i64 V, i64 Vp) {
  if (!tokens_in_range(targets, N, V)) return false;
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; n++) {
    const float* x = logits + n * Vp;
    float l = logsumexp_row(x, V);
    lse[n] = l;
    losses[n] = l - x[targets[n]];
  }
  return true;
}

bool crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const std::int32_t* targets, float dloss, i64 N, i64 V, i64 Vp) {
  if (!tokens_in_range(targets, N, V)) return false;
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; n++) {
    float* d = dlogits + n * Vp;
    crossentropy_grad_row(d, logits + n * Vp, lse[n], dloss, V, Vp);
    d[targets[n]] -= dloss;
  }
  return true;
}

}  // namespace troupe::gpu::cpu
