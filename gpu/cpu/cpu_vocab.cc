// Ops over the vocabulary: token + position embedding, and the cross-entropy
// of the LM head over a padded vocabulary (only the first V of Vp columns take
// part, so the padding never changes a result).
#include <cmath>

#include "gpu/cpu/cpu_convert.h"
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

// A vocabulary slice's row max and sum of exp(x - max), in the clone the
// CPU runs (called from a plain function, row_max and row_sum_exp would be
// compiled for the baseline ISA only: 11x slower, as `troupe plan
// calibrate` showed for tp > 1).
TROUPE_CLONES void max_sum_exp_row(const float* x, i64 V, float* max, float* sum) {
  const float m = row_max(x, V);
  *max = m;
  *sum = row_sum_exp(x, m, V);
}

TROUPE_CLONES void crossentropy_grad_row(float* d, const float* x, float lse, float dloss, i64 V,
                                         i64 Vp) {
  for (i64 j = 0; j < V; j++) d[j] = exp_approx(x[j] - lse) * dloss;
  for (i64 j = V; j < Vp; j++) d[j] = 0.0f;
}

TROUPE_CLONES void copy_row(float* out, const float* a, i64 C) {
  for (i64 i = 0; i < C; i++) out[i] = a[i];
}

// Columns of a slice starting at id `begin` whose ids are below V.
i64 local_columns(i64 V, i64 Vp, i64 begin) {
  const i64 n = V - begin;
  return n < 0 ? 0 : (n > Vp ? Vp : n);
}

bool tokens_in_range(const std::int32_t* tokens, i64 n, i64 limit) {
  for (i64 i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= limit) return false;
  }
  return true;
}

}  // namespace

bool embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       i64 B, i64 T, i64 C, i64 rows, i64 begin, i64 total) {
  if (!tokens_in_range(tokens, B * T, total)) return false;
#pragma omp parallel for schedule(static)
  for (i64 bt = 0; bt < B * T; bt++) {
    const i64 row = static_cast<i64>(tokens[bt]) - begin;
    const float* p = wpe + (bt % T) * C;
    if (row >= 0 && row < rows) {
      add_rows(out + bt * C, wte + row * C, p, C);
    } else {
      copy_row(out + bt * C, p, C);  // another rank's token: its row adds in the all-reduce
    }
  }
  return true;
}

namespace {

template <typename S>
void embedding_rows(void* out_, const std::int32_t* tokens, const void* wte_, const void* wpe_,
                    i64 B, i64 T, i64 C, i64 rows, i64 begin) {
  auto* out = static_cast<typename S::T*>(out_);
  const auto* wte = static_cast<const typename S::T*>(wte_);
  const auto* wpe = static_cast<const typename S::T*>(wpe_);
#pragma omp parallel for schedule(static)
  for (i64 bt = 0; bt < B * T; bt++) {
    const i64 row = static_cast<i64>(tokens[bt]) - begin;
    const typename S::T* p = wpe + (bt % T) * C;
    typename S::T* o = out + bt * C;
    if (row >= 0 && row < rows) {
      const typename S::T* w = wte + row * C;
      for (i64 i = 0; i < C; i++) o[i] = S::store(S::load(w[i]) + S::load(p[i]));
    } else {
      for (i64 i = 0; i < C; i++) o[i] = p[i];  // another rank's token: wpe alone
    }
  }
}

}  // namespace

bool embedding_forward(void* out, DType dt, const std::int32_t* tokens, const void* wte,
                       const void* wpe, i64 B, i64 T, i64 C, i64 rows, i64 begin, i64 total) {
  if (!tokens_in_range(tokens, B * T, total)) return false;
  if (dt == DType::kBF16) {
    embedding_rows<BF16>(out, tokens, wte, wpe, B, T, C, rows, begin);
  } else {
    embedding_rows<F16>(out, tokens, wte, wpe, B, T, C, rows, begin);
  }
  return true;
}

bool embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        i64 B, i64 T, i64 C, i64 rows, i64 begin, i64 total) {
  if (!tokens_in_range(tokens, B * T, total)) return false;
  // Each thread owns a range of columns and walks the tokens in order, so a
  // row hit by several tokens sums them in the same order on any team size.
  constexpr i64 kCols = 16;
#pragma omp parallel for schedule(static)
  for (i64 c0 = 0; c0 < C; c0 += kCols) {
    const i64 c1 = c0 + kCols < C ? c0 + kCols : C;
    for (i64 bt = 0; bt < B * T; bt++) {
      const float* d = dout + bt * C;
      const i64 row = static_cast<i64>(tokens[bt]) - begin;
      if (row >= 0 && row < rows) accumulate_range(dwte + row * C, d, c0, c1);
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
                           const std::int32_t* targets, float dloss, i64 N, i64 V, i64 Vp,
                           i64 begin) {
  if (!tokens_in_range(targets, N, V)) return false;
  const i64 valid = local_columns(V, Vp, begin);
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; n++) {
    float* d = dlogits + n * Vp;
    crossentropy_grad_row(d, logits + n * Vp, lse[n], dloss, valid, Vp);
    const i64 t = static_cast<i64>(targets[n]) - begin;
    if (t >= 0 && t < Vp) d[t] -= dloss;
  }
  return true;
}

bool crossentropy_partial(float* stats, const float* logits, const std::int32_t* targets, i64 N,
                          i64 V, i64 Vp, i64 begin) {
  if (!tokens_in_range(targets, N, V)) return false;
  const i64 valid = local_columns(V, Vp, begin);
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; n++) {
    const float* x = logits + n * Vp;
    float* st = stats + n * 3;
    st[0] = -INFINITY;
    st[1] = 0.0f;
    if (valid > 0) max_sum_exp_row(x, valid, &st[0], &st[1]);
    const i64 t = static_cast<i64>(targets[n]) - begin;
    st[2] = t >= 0 && t < valid ? x[t] : 0.0f;
  }
  return true;
}

void crossentropy_combine(float* losses, float* lse, const float* stats, i64 P, i64 N) {
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; n++) {
    float m = -INFINITY;
    for (i64 p = 0; p < P; p++) {
      const float* st = stats + (p * N + n) * 3;
      if (st[1] > 0.0f && st[0] > m) m = st[0];
    }
    float sum = 0.0f, target = 0.0f;
    for (i64 p = 0; p < P; p++) {  // slices in rank order
      const float* st = stats + (p * N + n) * 3;
      if (st[1] > 0.0f) sum += st[1] * std::exp(st[0] - m);
      target += st[2];
    }
    lse[n] = m + std::log(sum);
    losses[n] = lse[n] - target;
  }
}

}  // namespace troupe::gpu::cpu
