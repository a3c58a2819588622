// Causal multi-head self-attention, one (batch, head) pair per task.
//
// For each (b, h) the q, k, v heads are strided views into qkv[B,T,3C]
// (leading dimension 3C), so no transposes are materialised:
//   forward:  att = softmax_causal(q . k^T / sqrt(HS));  y = att . v
//   backward: datt = dy . v^T;  dv = att^T . dy;
//             dpre = att * (datt - rowsum(att * datt)) / sqrt(HS);
//             dq = dpre . k;  dk = dpre^T . q
// The (b, h) pairs run in parallel; each GEMM inside runs on one thread.
#include <algorithm>
#include <cmath>

#include "gpu/cpu/attention_head.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

// Row i of the scores: softmax over columns 0..i, zeros after.
TROUPE_CLONES void causal_softmax_row(float* row, i64 i, i64 T) {
  const float maxval = row_max(row, i + 1);
  for (i64 j = 0; j <= i; j++) row[j] = exp_approx(row[j] - maxval);
  const float inv = 1.0f / row_sum(row, i + 1);
  for (i64 j = 0; j <= i; j++) row[j] *= inv;
  for (i64 j = i + 1; j < T; j++) row[j] = 0.0f;
}

// datt row i -> dpre row i (in place), scaled by 1/sqrt(HS).
TROUPE_CLONES void softmax_backward_row(float* datt, const float* att, i64 i, i64 T, float scale) {
  const float dot = row_dot(att, datt, i + 1);
  for (i64 j = 0; j <= i; j++) datt[j] = att[j] * (datt[j] - dot) * scale;
  for (i64 j = i + 1; j < T; j++) datt[j] = 0.0f;
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, i64 B, i64 T, i64 C, i64 NH) {
  const i64 HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for schedule(static)
  for (i64 bh = 0; bh < B * NH; bh++) {
    const i64 b = bh / NH, h = bh % NH;
    const auto [q, k, v] = head_of(qkv, b, h, T, C, HS);
    float* a = att + bh * T * T;
    sgemm('N', 'T', T, T, HS, scale, q, C3, k, C3, 0.0f, a, T);
    for (i64 i = 0; i < T; i++) causal_softmax_row(a + i * T, i, T);
    sgemm('N', 'N', T, HS, T, 1.0f, a, T, v, C3, 0.0f, out + b * T * C + h * HS, C);
  }
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, i64 B, i64 T, i64 C, i64 NH) {
  const i64 HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for schedule(static)
  for (i64 bh = 0; bh < B * NH; bh++) {
    const i64 b = bh / NH, h = bh % NH;
    const auto [q, k, v] = head_of(qkv, b, h, T, C, HS);
    const auto [dq, dk, dv] = head_grad_of(dqkv, b, h, T, C, HS);
    const float* dy = dout + b * T * C + h * HS;
    const float* a = att + bh * T * T;
    float* da = datt + bh * T * T;
    sgemm('N', 'T', T, T, HS, 1.0f, dy, C, v, C3, 0.0f, da, T);
    sgemm('T', 'N', T, HS, T, 1.0f, a, T, dy, C, 0.0f, dv, C3);
    for (i64 i = 0; i < T; i++) softmax_backward_row(da + i * T, a + i * T, i, T, scale);
    sgemm('N', 'N', T, HS, T, 1.0f, da, T, k, C3, 0.0f, dq, C3);
    sgemm('T', 'N', T, HS, T, 1.0f, da, T, q, C3, 0.0f, dk, C3);
  }
}

// Generation: the n new positions' k and v go into the caches (rows
// pos..pos+n-1 of each head), then each query row i attends to the cache's
// rows 0..pos+i, as row pos+i of attention_forward's causal softmax does.
void attention_cached(float* out, float* att, float* kcache, float* vcache, const float* qkv, i64 B,
                      i64 n, i64 C, i64 NH, i64 Tc, i64 pos) {
  const i64 HS = C / NH, C3 = 3 * C, keys = pos + n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for schedule(static)
  for (i64 bh = 0; bh < B * NH; bh++) {
    const i64 b = bh / NH, h = bh % NH;
    const Head head = head_of(qkv, b, h, n, C, HS);
    const float* q = head.q;
    float* kc = kcache + bh * Tc * HS;
    float* vc = vcache + bh * Tc * HS;
    store_kv(kc, vc, head, n, pos, C, HS);
    float* a = att + bh * n * Tc;
    sgemm('N', 'T', n, keys, HS, scale, q, C3, kc, HS, 0.0f, a, Tc);
    for (i64 i = 0; i < n; i++) causal_softmax_row(a + i * Tc, pos + i, Tc);
    sgemm('N', 'N', n, HS, keys, 1.0f, a, Tc, vc, HS, 0.0f, out + b * n * C + h * HS, C);
  }
}

}  // namespace troupe::gpu::cpu
