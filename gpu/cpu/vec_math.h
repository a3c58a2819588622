// Elementwise math written so that GCC vectorizes the loops that call it
// (no libm calls, no branches): exp and tanh for softmax, cross-entropy and
// GELU. The functions that loop over these carry TROUPE_CLONES so that one
// binary uses AVX-512 or AVX2 where the CPU has it and SSE2 elsewhere.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TROUPE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TROUPE_CLONES
#endif

#define TROUPE_INLINE inline __attribute__((always_inline))

namespace troupe::gpu::cpu {

// e^x for finite x, within ~2 ulp; inputs below -87.3 give ~1e-38 (not 0) and
// above 88.7 give ~3e38 (not inf). Cephes' range reduction and polynomial.
TROUPE_INLINE float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  // n = round(x / ln 2) by the 1.5*2^23 trick (no rint call, so it vectorizes).
  const float shifter = 12582912.0f;
  float n = (x * 1.44269504088896341f + shifter) - shifter;
  float r = x - n * 0.693359375f;  // ln 2 split in a high and a low part
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  std::int32_t e = static_cast<std::int32_t>(n) + 127;
  return p * std::bit_cast<float>(e << 23);
}

// tanh(u) = 1 - 2 / (e^{2u} + 1); absolute error ~1e-7.
TROUPE_INLINE float tanh_approx(float u) { return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f); }

// Reductions over a row in kLanes interleaved partial sums, combined in a
// fixed order at the end. Strict IEEE order forbids vectorizing a single
// running sum; independent lanes vectorize, and the result is the same on
// every ISA (it depends on kLanes, not on the vector width).
constexpr int kLanes = 16;

TROUPE_INLINE float combine_lanes(const float* acc) {
  float s = 0.0f;
  for (int k = 0; k < kLanes; k++) s += acc[k];
  return s;
}

TROUPE_INLINE float row_sum(const float* x, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; k++) acc[k] += x[j + k];
  for (; j < n; j++) acc[j % kLanes] += x[j];
  return combine_lanes(acc);
}

TROUPE_INLINE float row_max(const float* x, std::int64_t n) {
  float acc[kLanes];
  for (int k = 0; k < kLanes; k++) acc[k] = x[0];
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; k++) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  for (; j < n; j++) acc[j % kLanes] = x[j] > acc[j % kLanes] ? x[j] : acc[j % kLanes];
  float m = acc[0];
  for (int k = 1; k < kLanes; k++) m = acc[k] > m ? acc[k] : m;
  return m;
}

TROUPE_INLINE float row_dot(const float* a, const float* b, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; k++) acc[k] += a[j + k] * b[j + k];
  for (; j < n; j++) acc[j % kLanes] += a[j] * b[j];
  return combine_lanes(acc);
}

// sum_j (x[j] - c)^2
TROUPE_INLINE float row_sq_dev(const float* x, float c, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; k++) acc[k] += (x[j + k] - c) * (x[j + k] - c);
  for (; j < n; j++) acc[j % kLanes] += (x[j] - c) * (x[j] - c);
  return combine_lanes(acc);
}

// sum_j e^(x[j] - shift)
TROUPE_INLINE float row_sum_exp(const float* x, float shift, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; k++) acc[k] += exp_approx(x[j + k] - shift);
  for (; j < n; j++) acc[j % kLanes] += exp_approx(x[j] - shift);
  return combine_lanes(acc);
}

}  // namespace troupe::gpu::cpu
