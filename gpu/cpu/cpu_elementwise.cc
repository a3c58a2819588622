// Elementwise kernels (GELU, residual, fill, axpy: in any compute dtype,
// converted in registers; AdamW in fp32) and the squared norm.
// Work is cut into fixed chunks so every element's arithmetic, and the order
// of the norm's partial sums, are independent of the thread count.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/cpu/cpu_convert.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/vec_math.h"

namespace troupe::gpu::cpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

template <typename S>
TROUPE_INLINE void gelu_forward_body(void* out_, const void* inp_, i64 i0, i64 i1) {
  auto* out = static_cast<typename S::T*>(out_);
  const auto* inp = static_cast<const typename S::T*>(inp_);
  for (i64 i = i0; i < i1; i++) {
    float x = S::load(inp[i]);
    float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = S::store(0.5f * x * (1.0f + tanh_approx(u)));
  }
}

template <typename S>
TROUPE_INLINE void gelu_backward_body(void* dinp_, const void* inp_, const void* dout_, i64 i0,
                                      i64 i1) {
  auto* dinp = static_cast<typename S::T*>(dinp_);
  const auto* inp = static_cast<const typename S::T*>(inp_);
  const auto* dout = static_cast<const typename S::T*>(dout_);
  for (i64 i = i0; i < i1; i++) {
    float x = S::load(inp[i]);
    float u = kGeluScale * (x + 0.044715f * x * x * x);
    float th = tanh_approx(u);
    float sech2 = 1.0f - th * th;
    float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = S::store((0.5f * (1.0f + th) + 0.5f * x * sech2 * du) * S::load(dout[i]));
  }
}

template <typename S>
TROUPE_INLINE void add_body(void* out_, const void* a_, const void* b_, i64 i0, i64 i1) {
  auto* out = static_cast<typename S::T*>(out_);
  const auto* a = static_cast<const typename S::T*>(a_);
  const auto* b = static_cast<const typename S::T*>(b_);
  for (i64 i = i0; i < i1; i++) out[i] = S::store(S::load(a[i]) + S::load(b[i]));
}

template <typename S>
TROUPE_INLINE void axpy_body(void* y_, float alpha, const void* x_, i64 i0, i64 i1) {
  auto* y = static_cast<typename S::T*>(y_);
  const auto* x = static_cast<const typename S::T*>(x_);
  for (i64 i = i0; i < i1; i++) y[i] = S::store(S::load(y[i]) + alpha * S::load(x[i]));
}

// One vectorized clone set per storage format.
#define TROUPE_ELEMENTWISE(S)                                                                 \
  TROUPE_CLONES void gelu_forward_##S(void* out, const void* inp, i64 i0, i64 i1) {           \
    gelu_forward_body<S>(out, inp, i0, i1);                                                   \
  }                                                                                           \
  TROUPE_CLONES void gelu_backward_##S(void* dinp, const void* inp, const void* dout, i64 i0, \
                                       i64 i1) {                                              \
    gelu_backward_body<S>(dinp, inp, dout, i0, i1);                                           \
  }                                                                                           \
  TROUPE_CLONES void add_##S(void* out, const void* a, const void* b, i64 i0, i64 i1) {       \
    add_body<S>(out, a, b, i0, i1);                                                           \
  }                                                                                           \
  TROUPE_CLONES void axpy_##S(void* y, float alpha, const void* x, i64 i0, i64 i1) {          \
    axpy_body<S>(y, alpha, x, i0, i1);                                                        \
  }
TROUPE_ELEMENTWISE(F32)
TROUPE_ELEMENTWISE(BF16)
TROUPE_ELEMENTWISE(F16)
#undef TROUPE_ELEMENTWISE

// Runs fn_<format>(args..., i0, i1) over fixed chunks for dtype dt.
#define TROUPE_DISPATCH(dt, fn, n, ...)                                       \
  switch (dt) {                                                               \
    case DType::kBF16:                                                        \
      for_chunks(n, [&](i64 i0, i64 i1) { fn##_BF16(__VA_ARGS__, i0, i1); }); \
      break;                                                                  \
    case DType::kF16:                                                         \
      for_chunks(n, [&](i64 i0, i64 i1) { fn##_F16(__VA_ARGS__, i0, i1); });  \
      break;                                                                  \
    default:                                                                  \
      for_chunks(n, [&](i64 i0, i64 i1) { fn##_F32(__VA_ARGS__, i0, i1); });  \
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

void gelu_forward(void* out, const void* inp, DType dt, i64 n) {
  TROUPE_DISPATCH(dt, gelu_forward, n, out, inp)
}

void gelu_backward(void* dinp, const void* inp, const void* dout, DType dt, i64 n) {
  TROUPE_DISPATCH(dt, gelu_backward, n, dinp, inp, dout)
}

void residual_forward(void* out, const void* a, const void* b, DType dt, i64 n) {
  TROUPE_DISPATCH(dt, add, n, out, a, b)
}

void axpy(void* y, float alpha, const void* x, DType dt, i64 n) {
  TROUPE_DISPATCH(dt, axpy, n, y, alpha, x)
}

void fill(void* x, float value, DType dt, i64 n) {
  if (dt == DType::kF32) {
    auto* f = static_cast<float*>(x);
    for_chunks(n, [&](i64 i0, i64 i1) {
      for (i64 i = i0; i < i1; i++) f[i] = value;
    });
    return;
  }
  const std::uint16_t h = dt == DType::kBF16 ? f32_to_bf16(value) : f32_to_f16(value);
  auto* p = static_cast<std::uint16_t*>(x);
  for_chunks(n, [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; i++) p[i] = h;
  });
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
