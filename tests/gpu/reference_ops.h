// Straightforward reference forwards in double, for the op tests: each is
// the textbook loop, written for clarity, not speed. The op tests compare the
// backends' fp32 forwards with these, and their backwards with central finite
// differences of these.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace troupe::testing {

using Vec = std::vector<double>;

inline Vec embedding_ref(const std::vector<std::int32_t>& tok, const Vec& wte, const Vec& wpe,
                         int B, int T, int C) {
  Vec out(static_cast<std::size_t>(B) * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        out[(b * T + t) * C + c] = wte[tok[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

inline Vec layernorm_ref(const Vec& x, const Vec& w, const Vec& b, int N, int C) {
  Vec out(x.size());
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) out[n * C + c] = (x[n * C + c] - m) * s * w[c] + b[c];
  }
  return out;
}

// out[N,OC] = inp[N,IC] . w[OC,IC]^T + bias
inline Vec matmul_ref(const Vec& inp, const Vec& w, const Vec& bias, int N, int IC, int OC) {
  Vec out(static_cast<std::size_t>(N) * OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < IC; i++) s += inp[n * IC + i] * w[o * IC + i];
      out[n * OC + o] = s;
    }
  return out;
}

inline Vec gelu_ref(const Vec& x) {
  Vec out(x.size());
  for (std::size_t i = 0; i < x.size(); i++) {
    const double u = std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
    out[i] = 0.5 * x[i] * (1.0 + std::tanh(u));
  }
  return out;
}

// Causal attention on qkv[B,T,3C]; returns y[B,T,C] (and att if asked).
inline Vec attention_ref(const Vec& qkv, int B, int T, int C, int NH, Vec* att_out = nullptr) {
  const int HS = C / NH;
  Vec y(static_cast<std::size_t>(B) * T * C, 0.0);
  if (att_out) att_out->assign(static_cast<std::size_t>(B) * NH * T * T, 0.0);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; j++) {
          double d = 0;
          for (int e = 0; e < HS; e++)
            d += qkv[(b * T + i) * 3 * C + h * HS + e] * qkv[(b * T + j) * 3 * C + C + h * HS + e];
          s[j] = d / std::sqrt(static_cast<double>(HS));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= i; j++) z += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= i; j++) {
          s[j] /= z;
          if (att_out) (*att_out)[((b * NH + h) * T + i) * T + j] = s[j];
          for (int e = 0; e < HS; e++)
            y[(b * T + i) * C + h * HS + e] += s[j] * qkv[(b * T + j) * 3 * C + 2 * C + h * HS + e];
        }
      }
  return y;
}

// Causal attention's gradient: dqkv[B,T,3C] of sum(y * dy) at qkv, by the
// textbook formulas (softmax's Jacobian) in double; lse[B,NH,T] (if asked)
// each query row's log-sum-exp of its scaled scores.
inline Vec attention_backward_ref(const Vec& qkv, const Vec& dy, int B, int T, int C, int NH,
                                  Vec* lse = nullptr) {
  const int HS = C / NH, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  Vec dqkv(qkv.size(), 0.0);
  if (lse) lse->assign(static_cast<std::size_t>(B) * NH * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int e) {
    return static_cast<std::size_t>((b * T + t) * C3 + part * C + h * HS + e);
  };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        std::vector<double> p(i + 1), dp(i + 1);
        double mx = -1e300, z = 0, dot = 0;
        for (int j = 0; j <= i; j++) {
          double d = 0;
          for (int e = 0; e < HS; e++) d += qkv[at(b, i, 0, h, e)] * qkv[at(b, j, 1, h, e)];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= i; j++) z += (p[j] = std::exp(p[j] - mx));
        if (lse) (*lse)[static_cast<std::size_t>((b * NH + h) * T + i)] = mx + std::log(z);
        for (int j = 0; j <= i; j++) {
          p[j] /= z;
          double d = 0;  // dp_j = dy_i . v_j
          for (int e = 0; e < HS; e++)
            d +=
                dy[static_cast<std::size_t>((b * T + i) * C + h * HS + e)] * qkv[at(b, j, 2, h, e)];
          dp[j] = d;
          dot += p[j] * d;
        }
        for (int j = 0; j <= i; j++) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (int e = 0; e < HS; e++) {
            dqkv[at(b, i, 0, h, e)] += ds * qkv[at(b, j, 1, h, e)];
            dqkv[at(b, j, 1, h, e)] += ds * qkv[at(b, i, 0, h, e)];
            dqkv[at(b, j, 2, h, e)] +=
                p[j] * dy[static_cast<std::size_t>((b * T + i) * C + h * HS + e)];
          }
        }
      }
  return dqkv;
}

// Per-row cross-entropy over the first V of Vp columns.
inline Vec crossentropy_ref(const Vec& logits, const std::vector<std::int32_t>& targets, int N,
                            int V, int Vp) {
  Vec losses(N);
  for (int n = 0; n < N; n++) {
    double mx = -1e300, z = 0;
    for (int j = 0; j < V; j++) mx = std::max(mx, logits[n * Vp + j]);
    for (int j = 0; j < V; j++) z += std::exp(logits[n * Vp + j] - mx);
    losses[n] = mx + std::log(z) - logits[n * Vp + targets[n]];
  }
  return losses;
}

// d(sum(f(x) * r))/dx by central differences in double.
template <typename F>
Vec numeric_grad(F&& f, Vec x, const Vec& r, double h = 1e-6) {
  Vec g(x.size());
  auto dot = [&](const Vec& y) {
    double s = 0;
    for (std::size_t i = 0; i < y.size(); i++) s += y[i] * r[i];
    return s;
  };
  for (std::size_t i = 0; i < x.size(); i++) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = dot(f(x));
    x[i] = keep - h;
    const double down = dot(f(x));
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

}  // namespace troupe::testing
