// The precisions troupe computes in, and the 16-bit float formats' bits.
//
// With --bf16/--fp16 tensors are stored in that format (DType::kBF16,
// kF16) and every op computes in fp32 in registers: it widens what it
// reads (exact) and rounds what it writes to the nearest value of the
// output's format, ties to even (IEEE round-to-nearest-even). fp16
// overflows to inf (|x| >= 65520), as a real fp16 store does, which is
// what loss scaling detects; NaN stays NaN.
//
//   std::uint16_t h = gpu::f32_to_bf16(x);      // the nearest bfloat16's bits
//   float y = gpu::bf16_to_f32(h);              // exact
#pragma once

#include <cstdint>
#include <cstring>

namespace troupe::gpu {

// The bits of a float and back.
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

// bfloat16: fp32's top 16 bits. Rounding adds half an ulp (less one, plus
// the kept lowest bit, for ties to even), which carries into the exponent
// when it must (up to inf); a NaN keeps a quiet bit so it stays NaN.
inline float bf16_to_f32(std::uint16_t h) {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}
inline std::uint16_t f32_to_bf16(float x) {
  std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// IEEE binary16 (F. Giesen's branch-light conversions). To fp32: rebias the
// exponent; subnormals through one exact float subtraction.
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
  const std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // inf or NaN
  } else if (exp == 0) {
    o += 1u << 23;  // subnormal: renormalise by subtracting 2^-14
    o = float_bits(bits_float(o) - bits_float(113u << 23));
  }
  return bits_float(o | ((static_cast<std::uint32_t>(h) & 0x8000u) << 16));
}
// From fp32: |x| >= 65520 rounds to inf; below 2^-14 the subnormal grid by
// adding 0.5f (the FPU rounds to its 2^-24 steps, ties to even); otherwise
// rebias and round the 13 dropped bits to nearest even.
inline std::uint16_t f32_to_f16(float x) {
  std::uint32_t u = float_bits(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  std::uint16_t o;
  if (u > 0x7f800000u) {
    o = 0x7e00u;  // NaN
  } else if (u >= 0x47800000u) {
    o = 0x7c00u;  // inf, and values at or past 2^16
  } else if (u < 0x38800000u) {
    o = static_cast<std::uint16_t>(float_bits(bits_float(u) + 0.5f) - float_bits(0.5f));
  } else {
    u += 0xc8000fffu + ((u >> 13) & 1u);  // exponent - 112, round to nearest even
    o = static_cast<std::uint16_t>(u >> 13);
  }
  return static_cast<std::uint16_t>(o | sign);
}

// x rounded to the nearest value of p's format (p = kFp32: x itself).
inline float round_to(float x, Precision p) {
  switch (p) {
    case Precision::kFp32:
      return x;
    case Precision::kBf16:
      return bf16_to_f32(f32_to_bf16(x));
    case Precision::kFp16:
      return f16_to_f32(f32_to_f16(x));
  }
  return x;
}
inline float round_bf16(float x) { return round_to(x, Precision::kBf16); }
inline float round_fp16(float x) { return round_to(x, Precision::kFp16); }

}  // namespace troupe::gpu
