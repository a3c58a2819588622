// Flash attention on the CPU: causal multi-head self-attention in tiles
// (Dao et al. 2022, with FlashAttention-2's loop order), so no T x T matrix
// is ever stored: per (batch, head), each block of kBr query rows meets the
// key/value blocks of kBc rows up to its causal limit, with an online
// softmax (the running row maximum m and sum l rescale the output so far),
// and keeps only the rows' log-sum-exp, lse = m + log l, for the backward.
//
// The backward recomputes each block's probabilities from lse,
// P = exp(q.k^T / sqrt(HS) - lse), and accumulates
//   dv_j += P^T . dy_i;  dP = dy_i . v_j^T;  dS = P * (dP - D_i) / sqrt(HS)
//   dk_j += dS^T . q_i;  dq_i += dS . k_j
// with D_i = rowsum(dy_i * y_i) (FlashAttention-2's D). One task owns a
// (batch, head) pair and walks its key blocks, then query blocks, in order,
// so every gradient row is summed in a fixed order whatever the threads.
//
// Memory: per task a kBr x kBc score tile and its gradient (D goes into the
// caller's delta[B,NH,T]); nothing grows with T^2. The work is the reference kernel's GEMMs on
// the causal half (blocks above the diagonal are skipped).
#include <algorithm>
#include <cmath>

#include "gpu/cpu/attention_head.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

constexpr i64 kBr = 128;  // query rows per block
constexpr i64 kBc = 128;  // key rows per block

// Keys 0..limit-1 of row r's block, clamped to the block: how many of the
// block's nc columns starting at key j0 row r (at position pos) may see.
i64 visible(i64 pos, i64 j0, i64 nc) { return std::clamp<i64>(pos - j0 + 1, 0, nc); }

// One block of the online softmax: s holds the scores of nr rows against nc
// keys starting at j0 (leading dimension kBc); row r sits at position p0 + r.
// Turns them into the block's unnormalised probabilities (zeros past the
// causal limit), updates m and l and rescales the output rows o.
TROUPE_CLONES void online_softmax_block(float* s, float* m, float* l, float* o, i64 ldo, i64 nr,
                                        i64 nc, i64 p0, i64 j0, i64 HS) {
  for (i64 r = 0; r < nr; r++) {
    float* row = s + r * kBc;
    const i64 n = visible(p0 + r, j0, nc);
    if (n == 0) {
      std::fill(row, row + nc, 0.0f);
      continue;
    }
    const float mx = std::max(m[r], row_max(row, n));
    // The first block's m is -inf: corr is then ~1e-38 (exp_approx's floor)
    // times an l and output rows that are still zeros.
    const float corr = exp_approx(m[r] - mx);
    for (i64 c = 0; c < n; c++) row[c] = exp_approx(row[c] - mx);
    const float sum = row_sum(row, n);
    std::fill(row + n, row + nc, 0.0f);
    l[r] = l[r] * corr + sum;
    m[r] = mx;
    if (corr != 1.0f) {
      float* y = o + r * ldo;
      for (i64 d = 0; d < HS; d++) y[d] *= corr;
    }
  }
}

// Rows 0..nr-1 of one head's queries (row r at position p0 + r) against keys
// 0..p0+nr-1: o = softmax_causal(q.k^T * scale) . v, lse (if not null) each
// row's log-sum-exp of the scaled scores.
void flash_rows(const float* q, i64 ldq, const float* k, const float* v, i64 ldkv, float* o,
                i64 ldo, float* lse, i64 nr, i64 p0, i64 HS, float scale) {
  // (Aligned as the device's tensors are: oneDNN's GEMMs may take another
  // path, and sum in another order, for another alignment.)
  alignas(64) float s[kBr * kBc];
  float m[kBr], l[kBr];
  for (i64 r0 = 0; r0 < nr; r0 += kBr) {
    const i64 br = std::min(kBr, nr - r0), pos = p0 + r0;
    float* y = o + r0 * ldo;
    std::fill(m, m + br, -INFINITY);
    std::fill(l, l + br, 0.0f);
    for (i64 r = 0; r < br; r++) std::fill(y + r * ldo, y + r * ldo + HS, 0.0f);
    const i64 keys = pos + br;
    for (i64 j0 = 0; j0 < keys; j0 += kBc) {
      const i64 nc = std::min(kBc, keys - j0);
      sgemm('N', 'T', br, nc, HS, scale, q + r0 * ldq, ldq, k + j0 * ldkv, ldkv, 0.0f, s, kBc);
      online_softmax_block(s, m, l, y, ldo, br, nc, pos, j0, HS);
      sgemm('N', 'N', br, HS, nc, 1.0f, s, kBc, v + j0 * ldkv, ldkv, 1.0f, y, ldo);
    }
    for (i64 r = 0; r < br; r++) {
      const float inv = 1.0f / l[r];
      for (i64 d = 0; d < HS; d++) y[r * ldo + d] *= inv;
      if (lse != nullptr) lse[r0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// P = exp(s - lse) in place (zeros past the causal limit), then, with dp =
// dy . v^T, dp = P * (dp - D) * scale: the block's dS.
TROUPE_CLONES void softmax_grad_block(float* p, float* dp, const float* lse, const float* D, i64 nr,
                                      i64 nc, i64 p0, i64 j0, float scale) {
  for (i64 r = 0; r < nr; r++) {
    float* pr = p + r * kBc;
    float* dr = dp + r * kBc;
    const i64 n = visible(p0 + r, j0, nc);
    for (i64 c = 0; c < n; c++) {
      pr[c] = exp_approx(pr[c] - lse[r]);
      dr[c] = pr[c] * (dr[c] - D[r]) * scale;
    }
    std::fill(pr + n, pr + nc, 0.0f);
    std::fill(dr + n, dr + nc, 0.0f);
  }
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, i64 B, i64 T, i64 C,
                             i64 NH) {
  const i64 HS = C / NH, C3 = 3 * C, blocks = (T + kBr - 1) / kBr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // Tasks from the last query block down: the long ones first.
#pragma omp parallel for schedule(dynamic)
  for (i64 t = B * NH * blocks - 1; t >= 0; t--) {
    const i64 bh = t / blocks, i0 = (t % blocks) * kBr, b = bh / NH, h = bh % NH;
    const i64 nr = std::min(kBr, T - i0);
    const auto [q, k, v] = head_of(qkv, b, h, T, C, HS);
    flash_rows(q + i0 * C3, C3, k, v, C3, out + (b * T + i0) * C + h * HS, C, lse + bh * T + i0, nr,
               i0, HS, scale);
  }
}

void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, i64 B, i64 T, i64 C, i64 NH) {
  const i64 HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for schedule(dynamic)
  for (i64 bh = 0; bh < B * NH; bh++) {
    const i64 b = bh / NH, h = bh % NH;
    const auto [q, k, v] = head_of(qkv, b, h, T, C, HS);
    const auto [dq, dk, dv] = head_grad_of(dqkv, b, h, T, C, HS);
    const float* dy = dout + b * T * C + h * HS;
    const float* y = out + b * T * C + h * HS;
    const float* L = lse + bh * T;
    float* D = delta + bh * T;
    alignas(64) float p[kBr * kBc];
    alignas(64) float dp[kBr * kBc];
    for (i64 i = 0; i < T; i++) {
      D[i] = row_dot(dy + i * C, y + i * C, HS);
      std::fill(dq + i * C3, dq + i * C3 + HS, 0.0f);
      std::fill(dk + i * C3, dk + i * C3 + HS, 0.0f);
      std::fill(dv + i * C3, dv + i * C3 + HS, 0.0f);
    }
    for (i64 j0 = 0; j0 < T; j0 += kBc) {
      const i64 nc = std::min(kBc, T - j0);
      // Query blocks that see any of these keys: from the one holding j0.
      for (i64 i0 = j0 / kBr * kBr; i0 < T; i0 += kBr) {
        const i64 nr = std::min(kBr, T - i0);
        sgemm('N', 'T', nr, nc, HS, scale, q + i0 * C3, C3, k + j0 * C3, C3, 0.0f, p, kBc);
        sgemm('N', 'T', nr, nc, HS, 1.0f, dy + i0 * C, C, v + j0 * C3, C3, 0.0f, dp, kBc);
        softmax_grad_block(p, dp, L + i0, D + i0, nr, nc, i0, j0, scale);
        sgemm('T', 'N', nc, HS, nr, 1.0f, p, kBc, dy + i0 * C, C, 1.0f, dv + j0 * C3, C3);
        sgemm('T', 'N', nc, HS, nr, 1.0f, dp, kBc, q + i0 * C3, C3, 1.0f, dk + j0 * C3, C3);
        sgemm('N', 'N', nr, HS, nc, 1.0f, dp, kBc, k + j0 * C3, C3, 1.0f, dq + i0 * C3, C3);
      }
    }
  }
}

void flash_attention_cached(float* out, float* kcache, float* vcache, const float* qkv, i64 B,
                            i64 n, i64 C, i64 NH, i64 Tc, i64 pos) {
  const i64 HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for schedule(static)
  for (i64 bh = 0; bh < B * NH; bh++) {
    const i64 b = bh / NH, h = bh % NH;
    const Head head = head_of(qkv, b, h, n, C, HS);
    const float* q = head.q;
    float* kc = kcache + bh * Tc * HS;
    float* vc = vcache + bh * Tc * HS;
    store_kv(kc, vc, head, n, pos, C, HS);
    flash_rows(q, C3, kc, vc, HS, out + b * n * C + h * HS, C, nullptr, n, pos, HS, scale);
  }
}

}  // namespace troupe::gpu::cpu
