// The precisions troupe computes in, and rounding an fp32 value to one.
//
// Mixed precision (--bf16, --fp16) keeps tensors in fp32 storage whose
// values are exactly representable in the compute precision: each op's
// output is rounded to it (ops::round_to) where a bf16/fp16 kernel would
// store it, so an fp32 GEMM on such inputs with fp32 accumulation equals a
// bf16/fp16 GEMM with fp32 accumulation up to the order of its sums, on any
// CPU. The rounding is IEEE round-to-nearest-even; fp16 overflows to inf
// (|x| >= 65520), as a real fp16 store does, which is what loss scaling
// detects.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace troupe::gpu {

// The bits of a float and back (memcpy: the C++17 .cu files include this).
inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

enum class Precision { kFp32, kBf16, kFp16 };

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

// x rounded to the nearest bfloat16 (8 bits of significand), ties to even;
// NaN stays NaN, and values past bf16's largest round to inf.
inline float round_bf16(float x) {
  std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                // carries into the exponent when it must
  return bits_float(u & 0xffff0000u);
}

// x rounded to the nearest IEEE half (11 bits of significand, exponents
// down to -14, subnormals to 2^-24), ties to even; |x| >= 65520 gives inf.
inline float round_fp16(float x) {
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  if (a >= 65520.0f) return std::copysign(INFINITY, x);
  float r;
  if (a < 0x1p-14f) {
    r = std::nearbyint(a * 0x1p24f) * 0x1p-24f;  // the subnormal grid (exact scalings)
  } else {
    std::uint32_t u = float_bits(a);
    u += 0xfffu + ((u >> 13) & 1u);
    r = bits_float(u & 0xffffe000u);
  }
  return std::copysign(r, x);
}

inline float round_to(float x, Precision p) {
  switch (p) {
    case Precision::kFp32:
      return x;
    case Precision::kBf16:
      return round_bf16(x);
    case Precision::kFp16:
      return round_fp16(x);
  }
  return x;
}

}  // namespace troupe::gpu
