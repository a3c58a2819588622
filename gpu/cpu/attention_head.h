// One (batch, head) pair's q, k and v as strided views into qkv[B,T,3C]
// (leading dimension 3C): the reference and the flash attention kernels'.
#pragma once

#include <algorithm>
#include <cstdint>

namespace troupe::gpu::cpu {

struct Head {
  const float* q;
  const float* k;
  const float* v;
};

inline Head head_of(const float* qkv, std::int64_t b, std::int64_t h, std::int64_t T,
                    std::int64_t C, std::int64_t HS) {
  const float* q = qkv + b * T * 3 * C + h * HS;
  return {q, q + C, q + 2 * C};
}

// The same head's gradients in dqkv[B,T,3C].
struct HeadGrad {
  float* dq;
  float* dk;
  float* dv;
};
inline HeadGrad head_grad_of(float* dqkv, std::int64_t b, std::int64_t h, std::int64_t T,
                             std::int64_t C, std::int64_t HS) {
  float* dq = dqkv + b * T * 3 * C + h * HS;
  return {dq, dq + C, dq + 2 * C};
}

// Generation: the n new positions' k and v rows (leading dimension 3C)
// into rows pos.. of one head's caches (HS a row).
inline void store_kv(float* kc, float* vc, const Head& head, std::int64_t n, std::int64_t pos,
                     std::int64_t C, std::int64_t HS) {
  for (std::int64_t i = 0; i < n; i++) {
    std::copy_n(head.k + i * 3 * C, HS, kc + (pos + i) * HS);
    std::copy_n(head.v + i * 3 * C, HS, vc + (pos + i) * HS);
  }
}

}  // namespace troupe::gpu::cpu
