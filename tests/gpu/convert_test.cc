// convert on every backend against a brute-force reference: every finite
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

#include "gpu/host_values.h"
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
// is not the nearest value, or its bits differ from the host conversion's
// (gpu/precision.h, what Gpt::init uses).
struct Outcome {
  int checked = 0, wrong = 0, host_differs = 0;
};

bool same_value(double want, float got) {
  return std::isnan(want) ? std::isnan(got)
                          : got == want && std::signbit(got) == std::signbit(want);
}

class ConvertTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dev_ = backend(GetParam());
    if (dev_ == nullptr) GTEST_SKIP() << GetParam() << ": " << no_cuda_reason();
  }
  // Converts the probes of `g` from f32 to `to` and back on the backend
  // (the way back is exact); the first few wrong values are reported.
  Outcome check(gpu::DType to, const Grid& g) {
    Outcome o;
    std::unique_ptr<gpu::Stream> s = dev_->make_stream({.threads = 2});
    std::mt19937 rng(7);
    const std::vector<float> x = probes(g, rng);
    const std::int64_t n = static_cast<std::int64_t>(x.size());
    Tensor in = Tensor::empty(*dev_, gpu::DType::kF32, {n});
    Tensor half = Tensor::empty(*dev_, to, {n});
    Tensor back = Tensor::empty(*dev_, gpu::DType::kF32, {n});
    std::vector<float> got(x.size());
    std::vector<std::uint16_t> bits(x.size());
    absl::Status st = dev_->copy_from_host(x.data(), in);
    gpu::ops::convert(*s, half, in);
    gpu::ops::convert(*s, back, half);
    if (st.ok()) st = s->synchronize();
    if (st.ok()) st = dev_->copy_to_host(back, got.data());
    if (st.ok()) st = dev_->copy_to_host(half, bits.data());
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return o;
    }
    const Precision p = gpu::dtype_precision(to);
    for (std::size_t i = 0; i < x.size(); i++) {
      o.checked++;
      const double want = nearest(g, x[i]);
      if (!same_value(want, got[i]) && ++o.wrong <= 5) {
        ADD_FAILURE() << gpu::precision_name(p) << " of " << std::hexfloat << x[i] << ": got "
                      << got[i] << ", want " << want;
      }
      const std::uint16_t host =
          p == Precision::kBf16 ? gpu::f32_to_bf16(x[i]) : gpu::f32_to_f16(x[i]);
      if (!std::isnan(want) && host != bits[i]) o.host_differs++;
    }
    return o;
  }
  gpu::Device* dev_ = nullptr;
};

TEST_P(ConvertTest, Bf16IsTheNearestValueTiesToEven) {
  const Outcome o = check(gpu::DType::kBF16, make_grid(7, 8));
  EXPECT_GT(o.checked, 4000);
  EXPECT_EQ(o.wrong, 0);
  EXPECT_EQ(o.host_differs, 0);
}

TEST_P(ConvertTest, F16IsTheNearestValueTiesToEvenAndOverflowsToInf) {
  const Outcome o = check(gpu::DType::kF16, make_grid(10, 5));
  EXPECT_GT(o.checked, 4000);
  EXPECT_EQ(o.wrong, 0);
  EXPECT_EQ(o.host_differs, 0);
}

// Every bf16 bit pattern converted to f16 is the f16 nearest its value
// (bf16 has the wider range and f16 the finer steps: both ways round).
TEST_P(ConvertTest, EveryBf16ToF16IsTheNearestF16) {
  std::unique_ptr<gpu::Stream> s = dev_->make_stream({.threads = 2});
  std::vector<std::uint16_t> all(65536), got(65536);
  for (std::uint32_t i = 0; i < 65536; i++) all[i] = static_cast<std::uint16_t>(i);
  Tensor b = Tensor::empty(*dev_, gpu::DType::kBF16, {65536});
  Tensor h = Tensor::empty(*dev_, gpu::DType::kF16, {65536});
  ASSERT_TRUE(dev_->copy_from_host(all.data(), b).ok());
  gpu::ops::convert(*s, h, b);
  ASSERT_TRUE(s->synchronize().ok());
  ASSERT_TRUE(dev_->copy_to_host(h, got.data()).ok());
  const Grid g = make_grid(10, 5);
  int wrong = 0;
  for (std::uint32_t i = 0; i < 65536; i++) {
    const double want = nearest(g, gpu::bf16_to_f32(all[i]));
    if (!same_value(want, gpu::f16_to_f32(got[i])) && ++wrong <= 5) {
      ADD_FAILURE() << "bf16 " << std::hex << i << ": got f16 " << got[i] << ", want " << want;
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST_P(ConvertTest, F32CopiesAndBadShapesNameTheOp) {
  gpu::Device* dev = dev_;
  std::unique_ptr<gpu::Stream> s = dev->make_stream({.threads = 1});
  const std::vector<float> x = {1.0f + 0x1p-20f, -3.5f, 1e-30f};
  Tensor in = Tensor::empty(*dev, gpu::DType::kF32, {3});
  Tensor out = Tensor::empty(*dev, gpu::DType::kF32, {3});
  ASSERT_TRUE(dev->copy_from_host(x.data(), in).ok());
  gpu::ops::convert(*s, out, in);
  ASSERT_TRUE(s->synchronize().ok());
  std::vector<float> got(3);
  ASSERT_TRUE(dev->copy_to_host(out, got.data()).ok());
  EXPECT_EQ(got, x);
  gpu::ops::convert(*s, Tensor::empty(*dev, gpu::DType::kBF16, {3}),
                    Tensor::empty(*dev, gpu::DType::kF32, {4}));
  const absl::Status st = s->synchronize();
  EXPECT_EQ(st.message(), "convert: in is f32[4], want f32[3]");
}

TEST_P(ConvertTest, OverlappingDtypesAreRefused) {
  std::unique_ptr<gpu::Stream> s = dev_->make_stream({.threads = 1});
  Tensor f = Tensor::empty(*dev_, gpu::DType::kF32, {8});
  Tensor h = f;  // the same bytes seen as bf16
  h.dtype = gpu::DType::kBF16;
  h.shape = {8};
  h.strides = gpu::contiguous_strides(h.shape);
  gpu::ops::convert(*s, h, f.view(0, {8}));
  EXPECT_EQ(s->synchronize().message(), "convert: out and in overlap");
}

// fp32 host values into a bf16 tensor are rounded to the nearest bf16
// (the grid's), and come back exactly; a count that is not the tensor's
// is an error naming the call.
TEST_P(ConvertTest, HostValuesAreRoundedInAndWidenedOut) {
  const Grid g = make_grid(7, 8);
  const std::vector<float> x = {1.0f + 0x1p-9f, 1.0f + 3 * 0x1p-9f, -0.1f, 3e38f, 0.0f};
  Tensor t = Tensor::empty(*dev_, gpu::DType::kBF16, {5});
  ASSERT_TRUE(gpu::copy_values_to_device(x, t).ok());
  std::vector<float> back(5);
  ASSERT_TRUE(gpu::copy_values_to_host(t, back).ok());
  for (std::size_t i = 0; i < x.size(); i++) {
    EXPECT_TRUE(same_value(nearest(g, x[i]), back[i])) << x[i] << " came back as " << back[i];
  }
  const absl::Status st = gpu::copy_values_to_device(std::vector<float>(4), t);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "copy_values_to_device: 4 values for bf16[5]");
}

INSTANTIATE_TEST_SUITE_P(Backends, ConvertTest, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace troupe::testing
