// round_to on every backend against a brute-force reference: every finite
// bf16 and fp16 value is listed from its bits (by the formula of the
// format, not by conversion code), and each input's expected result is the
// nearest of them, found in double, ties to the even bit pattern; past the
// largest finite value the next value is 2^128 (bf16) or 2^16 (fp16),
// standing for inf, as IEEE's rounding defines overflow.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gpu/ops.h"
#include "tests/gpu/backends.h"

namespace troupe::testing {
namespace {

using gpu::Precision;
using gpu::Tensor;

// The non-negative values of a format with `mbits` stored significand bits
// and exponent bias `bias`, in order, with their bit patterns; the last is
// the overflow value (stands for inf).
struct Grid {
  std::vector<double> value;
  std::vector<std::uint32_t> bits;
};

Grid make_grid(int mbits, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1, emax = (1 << ebits) - 1;
  Grid g;
  for (std::uint32_t e = 0; e < static_cast<std::uint32_t>(emax); e++) {
    for (std::uint32_t m = 0; m < (1u << mbits); m++) {
      const double frac = static_cast<double>(m) / static_cast<double>(1u << mbits);
      const double v =
          e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0 + frac, static_cast<int>(e) - bias);
      g.value.push_back(v);
      g.bits.push_back((e << mbits) | m);
    }
  }
  g.value.push_back(std::ldexp(1.0, emax - bias));  // the first power past the range: inf
  g.bits.push_back(static_cast<std::uint32_t>(emax) << mbits);
  return g;
}

double nearest(const Grid& g, double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  if (a >= g.value.back()) return std::copysign(INFINITY, x);
  const auto hi = std::lower_bound(g.value.begin(), g.value.end(), a);
  const std::size_t j = static_cast<std::size_t>(hi - g.value.begin());
  double r;
  if (g.value[j] == a || j == 0) {
    r = g.value[j];
  } else {
    const double dl = a - g.value[j - 1], dh = g.value[j] - a;
    r = dl < dh || (dl == dh && g.bits[j - 1] % 2 == 0) ? g.value[j - 1] : g.value[j];
  }
  if (r == g.value.back()) r = INFINITY;
  return std::copysign(r, x);
}

// Inputs that probe each format: random values over its whole exponent
// range and beyond, exact ties and their neighbours, the overflow edge,
// subnormals, zeros, inf and NaN.
std::vector<float> probes(const Grid& g, std::mt19937& rng) {
  std::vector<float> x;
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  // Half over fp32's exponents, half over the format's (and just past it).
  const int lo = static_cast<int>(std::log2(g.value[1])) - 2;
  const int hi = std::min(127, static_cast<int>(std::log2(g.value.back())) + 1);
  std::uniform_int_distribution<int> wide(-140, 127), own(lo, hi);
  for (int i = 0; i < 4000; i++) {
    const float v = std::ldexp(mant(rng), i % 4 < 2 ? own(rng) : wide(rng));
    x.push_back(i % 2 == 0 ? v : -v);
  }
  for (std::size_t j = 1; j + 1 < g.value.size(); j += 97) {
    const float mid = static_cast<float>((g.value[j - 1] + g.value[j]) / 2);
    x.push_back(mid);
    x.push_back(std::nextafter(mid, 0.0f));
    x.push_back(std::nextafter(mid, INFINITY));
    x.push_back(-mid);
  }
  const double top = g.value[g.value.size() - 2], past = g.value.back();
  if (top < std::numeric_limits<float>::max()) {
    for (double v : {top, (top + past) / 2, past}) {
      const float f = static_cast<float>(v);
      for (float y : {f, std::nextafter(f, 0.0f), std::nextafter(f, INFINITY)}) x.push_back(y);
    }
  } else {
    x.push_back(std::numeric_limits<float>::max());
  }
  for (float v : {0.0f, -0.0f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-26f, 0x1p-14f, 0x1p-126f, 0x1p-133f,
                  INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()}) {
    x.push_back(v);
  }
  return x;
}

// What one check found: values checked, and those where the op's result
// is not the nearest value, the in-place result differs from it, or the
// host function (what Gpt::init uses) differs from it.
struct Outcome {
  int checked = 0, wrong = 0, in_place_differs = 0, host_differs = 0;
};

class RoundTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dev_ = backend(GetParam());
    if (dev_ == nullptr) GTEST_SKIP() << GetParam() << ": " << no_cuda_reason();
  }
  // Rounds the probes of `g` on the backend (out of place and in place);
  // the first few wrong values are reported by name.
  Outcome check(Precision p, const Grid& g) {
    Outcome o;
    std::unique_ptr<gpu::Stream> s = dev_->make_stream({.threads = 2});
    std::mt19937 rng(7);
    const std::vector<float> x = probes(g, rng);
    const std::int64_t n = static_cast<std::int64_t>(x.size());
    Tensor in = Tensor::empty(*dev_, gpu::DType::kF32, {n});
    Tensor out = Tensor::empty(*dev_, gpu::DType::kF32, {n});
    std::vector<float> got(x.size()), again(x.size());
    absl::Status st = dev_->copy_from_host(x.data(), in);
    gpu::ops::round_to(*s, out, in, p);
    gpu::ops::round_to(*s, in, in, p);  // in place
    if (st.ok()) st = s->synchronize();
    if (st.ok()) st = dev_->copy_to_host(out, got.data());
    if (st.ok()) st = dev_->copy_to_host(in, again.data());
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return o;
    }
    for (std::size_t i = 0; i < x.size(); i++) {
      o.checked++;
      const double want = nearest(g, x[i]);
      const bool same = std::isnan(want)
                            ? std::isnan(got[i])
                            : got[i] == want && std::signbit(got[i]) == std::signbit(want);
      if (!same && ++o.wrong <= 5) {
        ADD_FAILURE() << gpu::precision_name(p) << " of " << std::hexfloat << x[i] << ": got "
                      << got[i] << ", want " << want;
      }
      if (std::isnan(want)) continue;
      if (gpu::float_bits(again[i]) != gpu::float_bits(got[i])) o.in_place_differs++;
      if (gpu::float_bits(gpu::round_to(x[i], p)) != gpu::float_bits(got[i])) o.host_differs++;
    }
    return o;
  }
  gpu::Device* dev_ = nullptr;
};

TEST_P(RoundTest, Bf16IsTheNearestValueTiesToEven) {
  const Outcome o = check(Precision::kBf16, make_grid(7, 8));
  EXPECT_GT(o.checked, 4000);
  EXPECT_EQ(o.wrong, 0);
  EXPECT_EQ(o.in_place_differs, 0);
  EXPECT_EQ(o.host_differs, 0);
}

TEST_P(RoundTest, Fp16IsTheNearestValueTiesToEvenAndOverflowsToInf) {
  const Outcome o = check(Precision::kFp16, make_grid(10, 5));
  EXPECT_GT(o.checked, 4000);
  EXPECT_EQ(o.wrong, 0);
  EXPECT_EQ(o.in_place_differs, 0);
  EXPECT_EQ(o.host_differs, 0);
}

TEST_P(RoundTest, Fp32CopiesAndBadShapesNameTheOp) {
  gpu::Device* dev = dev_;
  std::unique_ptr<gpu::Stream> s = dev->make_stream({.threads = 1});
  const std::vector<float> x = {1.0f + 0x1p-20f, -3.5f, 1e-30f};
  Tensor in = Tensor::empty(*dev, gpu::DType::kF32, {3});
  Tensor out = Tensor::empty(*dev, gpu::DType::kF32, {3});
  ASSERT_TRUE(dev->copy_from_host(x.data(), in).ok());
  gpu::ops::round_to(*s, out, in, Precision::kFp32);
  ASSERT_TRUE(s->synchronize().ok());
  std::vector<float> got(3);
  ASSERT_TRUE(dev->copy_to_host(out, got.data()).ok());
  EXPECT_EQ(got, x);
  gpu::ops::round_to(*s, out, Tensor::empty(*dev, gpu::DType::kF32, {4}), Precision::kBf16);
  const absl::Status st = s->synchronize();
  EXPECT_EQ(st.message(), "round_to: in is f32[4], want f32[3]");
}

INSTANTIATE_TEST_SUITE_P(Backends, RoundTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace troupe::testing
