// Elementwise kernels (GELU, residual, fill, axpy, rounding, AdamW) and the
// squared norm.
// Work is cut into fixed chunks so every element's arithmetic, and the order
// of the norm's partial sums, are independent of the thread count.
#include <cmath>
#include <vector>

#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

constexpr i64 kChunk = 1 << 14;

template <typename F>
void for_chunks(i64 n, F&& f) {
#pragma omp parallel for schedule(static)
  for (i64 i0 = 0; i0 < n; i0 += kChunk) f(i0, i0 + kChunk < n ? i0 + kChunk : n);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

TROUPE_CLONES void gelu_forward_range(float* out, const float* inp, i64 i0, i64 i1) {
  for (i64 i = i0; i < i1; i++) {
    float x = inp[i];
    float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanh_approx(u));
  }
}

TROUPE_CLONES void gelu_backward_range(float* dinp, const float* inp, const float* dout, i64 i0,
                                       i64 i1) {
  for (i64 i = i0; i < i1; i++) {
    float x = inp[i];
    float u = kGeluScale * (x + 0.044715f * x * x * x);
    float th = tanh_approx(u);
    float sech2 = 1.0f - th * th;
    float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = (0.5f * (1.0f + th) + 0.5f * x * sech2 * du) * dout[i];
  }
}

TROUPE_CLONES void add_range(float* out, const float* a, const float* b, i64 i0, i64 i1) {
  for (i64 i = i0; i < i1; i++) out[i] = a[i] + b[i];
}

TROUPE_CLONES void axpy_range(float* y, float alpha, const float* x, i64 i0, i64 i1) {
  for (i64 i = i0; i < i1; i++) y[i] += alpha * x[i];
}

TROUPE_CLONES void round_range(float* out, const float* in, Precision p, i64 i0, i64 i1) {
  if (p == Precision::kBf16) {
    for (i64 i = i0; i < i1; i++) out[i] = round_bf16(in[i]);
  } else if (p == Precision::kFp16) {
    for (i64 i = i0; i < i1; i++) out[i] = round_fp16(in[i]);
  } else if (out != in) {
    for (i64 i = i0; i < i1; i++) out[i] = in[i];
  }
}

TROUPE_CLONES double squares_range(const float* x, i64 i0, i64 i1) {
  double s = 0.0;
  for (i64 i = i0; i < i1; i++) s += static_cast<double>(x[i]) * x[i];
  return s;
}

struct AdamConsts {
  float lr, beta1, beta2, eps, decay, bc1, bc2, grad_scale;
};

// PyTorch's AdamW order: p *= 1 - lr*wd, then p -= lr/bc1 * m / (sqrt(v/bc2) + eps).
TROUPE_CLONES void adamw_range(float* p, const float* g, float* m, float* v, AdamConsts k, i64 i0,
                               i64 i1) {
  for (i64 i = i0; i < i1; i++) {
    float grad = g[i] * k.grad_scale;
    float mi = k.beta1 * m[i] + (1.0f - k.beta1) * grad;
    float vi = k.beta2 * v[i] + (1.0f - k.beta2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / k.bc1;
    float vhat = vi / k.bc2;
    float pi = p[i] * (1.0f - k.lr * k.decay);
    p[i] = pi - k.lr * mhat / (std::sqrt(vhat) + k.eps);
  }
}

}  // namespace

void gelu_forward(float* out, const float* inp, i64 n) {
  for_chunks(n, [&](i64 i0, i64 i1) { gelu_forward_range(out, inp, i0, i1); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, i64 n) {
  for_chunks(n, [&](i64 i0, i64 i1) { gelu_backward_range(dinp, inp, dout, i0, i1); });
}

void residual_forward(float* out, const float* a, const float* b, i64 n) {
  for_chunks(n, [&](i64 i0, i64 i1) { add_range(out, a, b, i0, i1); });
}

void fill(float* x, float value, i64 n) {
  for_chunks(n, [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; i++) x[i] = value;
  });
}

void axpy(float* y, float alpha, const float* x, i64 n) {
  for_chunks(n, [&](i64 i0, i64 i1) { axpy_range(y, alpha, x, i0, i1); });
}

void round_to(float* out, const float* in, i64 n, Precision p) {
  for_chunks(n, [&](i64 i0, i64 i1) { round_range(out, in, p, i0, i1); });
}

double squared_norm(const float* x, i64 n) {
  const i64 chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks));
  for_chunks(n, [&](i64 i0, i64 i1) { partial[i0 / kChunk] = squares_range(x, i0, i1); });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

void adamw(float* p, const float* g, float* m, float* v, i64 n, float lr, float beta1, float beta2,
           float eps, float weight_decay, int step, float grad_scale) {
  AdamConsts k{lr,
               beta1,
               beta2,
               eps,
               weight_decay,
               1.0f - std::pow(beta1, static_cast<float>(step)),
               1.0f - std::pow(beta2, static_cast<float>(step)),
               grad_scale};
  for_chunks(n, [&](i64 i0, i64 i1) { adamw_range(p, g, m, v, k, i0, i1); });
}

}  // namespace troupe::gpu::cpu
