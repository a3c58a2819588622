// One (batch, head) pair's q, k and v as strided views into qkv[B,T,3C]
// (leading dimension 3C): the reference and the flash attention kernels'.
#pragma once

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

}  // namespace troupe::gpu::cpu
