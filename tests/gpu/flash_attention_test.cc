// The flash attention family (gpu/kernels.h) on every backend and compute
// dtype (ops_fixture.h): forward, log-sum-exp and backward against double
// references at shapes that span several tiles with a partial last one
// (head sizes 8, 64 and 128), bitwise the same from run to run, the
// KV-cached step against causal attention over the whole sequence, and
// the reference kernel's results within the dtype's tolerance.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "gpu/ops.h"
#include "tests/gpu/ops_fixture.h"

namespace troupe::testing {
namespace {

class FlashAttentionTest : public OpsTest {
 protected:
  void cached_in_chunks(int C);
};
class Fp32FlashAttentionTest : public OpsTest {};

struct Shape {
  int B, T, C, NH;
};
// Tiles are 128 rows on the CPU, 64 on CUDA's tensor cores, and CUDA's
// other kernels take keys 32 at a time: shapes of one to three tiles with a
// partial last, at head sizes 8, 64 and 128 (the tensor-core forward's in
// 16 bits) and 160 (MT-NLG's); a single row, and 17 rows (a tile whose
// last warp has no rows).
constexpr Shape kShapes[] = {{2, 70, 16, 2},  {2, 130, 128, 2}, {2, 67, 256, 2}, {1, 300, 16, 2},
                             {1, 70, 320, 2}, {1, 1, 128, 2},   {2, 17, 128, 2}};
// lse is fp32 from inputs representable in every dtype: close to double.
constexpr double kLseTol = 1e-5;

struct FlashRun {
  Vec y, lse, dqkv;
};

TEST_P(FlashAttentionTest, ForwardLseAndBackwardEqualTheDoubleReference) {
  for (const Shape& sh : kShapes) {
    const int B = sh.B, T = sh.T, C = sh.C, NH = sh.NH;
    SCOPED_TRACE(::testing::Message() << "B " << B << " T " << T << " HS " << C / NH);
    Tensor qkv = rnd({B, T, 3 * C}), dy = rnd({B, T, C});
    Tensor out = zeros({B, T, C}), lse = zeros32({B, NH, T}), delta = zeros32({B, NH, T});
    Tensor dqkv = zeros({B, T, 3 * C});
    const Tensor qkv_d = on(qkv);
    ops::flash_attention_forward(*stream_, out, lse, qkv_d);
    ops::flash_attention_backward(*stream_, dqkv, delta, on(dy), qkv_d, out, lse);
    const Vec y = host(out), l = host(lse), g = host(dqkv);
    SKIP_IF_UNSUPPORTED();
    const Vec qd = to_double(qkv);
    Vec want_lse;
    const Vec want_g = attention_backward_ref(qd, to_double(dy), B, T, C, NH, &want_lse);
    const double ey = rel_error(y, attention_ref(qd, B, T, C, NH)), el = rel_error(l, want_lse),
                 eg = rel_error(g, want_g);
    std::printf("B %d T %d HS %d: out %.2e, lse %.2e, dqkv %.2e\n", B, T, C / NH, ey, el, eg);
    EXPECT_LT(ey, fwd_tol());
    EXPECT_LT(el, kLseTol);
    EXPECT_LT(eg, bwd_tol());
  }
}

TEST_P(FlashAttentionTest, IsBitwiseTheSameFromRunToRun) {
  const int B = 2, T = 140, C = 128, NH = 2;
  Tensor qkv = rnd({B, T, 3 * C}), dy = rnd({B, T, C});
  auto run = [&] {
    Tensor out = zeros({B, T, C}), lse = zeros32({B, NH, T}), delta = zeros32({B, NH, T});
    Tensor dqkv = zeros({B, T, 3 * C});
    const Tensor qkv_d = on(qkv);
    ops::flash_attention_forward(*stream_, out, lse, qkv_d);
    ops::flash_attention_backward(*stream_, dqkv, delta, on(dy), qkv_d, out, lse);
    return FlashRun{host(out), host(lse), host(dqkv)};
  };
  const FlashRun a = run(), b = run();
  SKIP_IF_UNSUPPORTED();
  EXPECT_TRUE(a.y == b.y);
  EXPECT_TRUE(a.lse == b.lse);
  EXPECT_TRUE(a.dqkv == b.dqkv);
}

// A stream of one thread and one of two: bitwise the same (the CPU's
// tasks each sum in a fixed order whatever the team).
TEST_P(FlashAttentionTest, OneThreadIsBitwiseTwo) {
  const int B = 2, T = 140, C = 128, NH = 2;
  Tensor qkv = rnd({B, T, 3 * C}), dy = rnd({B, T, C});
  auto run = [&] {
    Tensor out = zeros({B, T, C}), lse = zeros32({B, NH, T}), delta = zeros32({B, NH, T});
    Tensor dqkv = zeros({B, T, 3 * C});
    const Tensor qkv_d = on(qkv);
    ops::flash_attention_forward(*stream_, out, lse, qkv_d);
    ops::flash_attention_backward(*stream_, dqkv, delta, on(dy), qkv_d, out, lse);
    return FlashRun{host(out), host(lse), host(dqkv)};
  };
  const FlashRun two = run();
  std::unique_ptr<gpu::Stream> one = dev_->make_stream({.threads = 1});
  std::swap(stream_, one);
  const FlashRun single = run();
  std::swap(stream_, one);
  SKIP_IF_UNSUPPORTED();
  EXPECT_TRUE(single.y == two.y);
  EXPECT_TRUE(single.lse == two.lse);
  EXPECT_TRUE(single.dqkv == two.dqkv);
}

// The two kernel families on one backend: the same attention, summed in
// different orders.
TEST_P(FlashAttentionTest, AgreesWithTheReferenceKernel) {
  const int B = 2, T = 70, C = 16, NH = 2;
  Tensor qkv = rnd({B, T, 3 * C}), dy = rnd({B, T, C});
  const Tensor qkv_d = on(qkv), dy_d = on(dy);
  Tensor out = zeros({B, T, C}), lse = zeros32({B, NH, T}), delta = zeros32({B, NH, T});
  Tensor dqkv = zeros({B, T, 3 * C});
  ops::flash_attention_forward(*stream_, out, lse, qkv_d);
  ops::flash_attention_backward(*stream_, dqkv, delta, dy_d, qkv_d, out, lse);
  Tensor rout = zeros({B, T, C}), att = zeros({B, NH, T, T}), datt = zeros({B, NH, T, T});
  Tensor rdqkv = zeros({B, T, 3 * C});
  ops::attention_forward(*stream_, rout, att, qkv_d);
  ops::attention_backward(*stream_, rdqkv, datt, dy_d, qkv_d, att);
  const Vec y = host(out), g = host(dqkv), ry = host(rout), rg = host(rdqkv);
  SKIP_IF_UNSUPPORTED();
  EXPECT_LT(rel_error(y, ry), fwd_tol());
  EXPECT_LT(rel_error(g, rg), bwd_tol());
}

// qkv one element into its allocation (not 16-byte aligned): CUDA's 16-bit
// forward at head size 64 then takes its CUDA-core kernel, not the
// tensor-core one; the same results.
TEST_P(FlashAttentionTest, AnUnalignedQkvView) {
  const int B = 2, T = 70, C = 128, NH = 2;
  Tensor qkv = rnd({B, T, 3 * C}), dy = rnd({B, T, C});
  Tensor whole = zeros({B * T * 3 * C + 1});
  const Tensor view = whole.view(1, {B, T, 3 * C});
  ops::copy(*stream_, view, on(qkv));
  Tensor out = zeros({B, T, C}), lse = zeros32({B, NH, T}), delta = zeros32({B, NH, T});
  Tensor dqkv = zeros({B, T, 3 * C});
  ops::flash_attention_forward(*stream_, out, lse, view);
  ops::flash_attention_backward(*stream_, dqkv, delta, on(dy), view, out, lse);
  const Vec y = host(out), g = host(dqkv);
  SKIP_IF_UNSUPPORTED();
  const Vec qd = to_double(qkv);
  EXPECT_LT(rel_error(y, attention_ref(qd, B, T, C, NH)), fwd_tol());
  EXPECT_LT(rel_error(g, attention_backward_ref(qd, to_double(dy), B, T, C, NH)), bwd_tol());
}

// Generation's step in the flash family, fed a prompt longer than a tile,
// one token, then 9 more: causal attention over the whole sequence, and
// every position's k and v left in the caches (head sizes 8 and 64).
TEST_P(FlashAttentionTest, CachedStepsEqualCausalAttentionInChunks) {
  for (const int C : {16, 128}) {
    SCOPED_TRACE(::testing::Message() << "C " << C);
    cached_in_chunks(C);
    if (unsupported()) GTEST_SKIP() << skipped_;
  }
}

void FlashAttentionTest::cached_in_chunks(int C) {
  const int B = 2, T = 140, NH = 2, HS = C / NH, Tc = 144;
  Tensor qkv = rnd({B, T, 3 * C});
  Tensor kc = zeros({B, NH, Tc, HS}), vc = zeros({B, NH, Tc, HS});
  const float* q = qkv.data<float>();
  Vec got(static_cast<std::size_t>(B) * T * C, 0.0);
  for (auto [pos, n] : {std::pair{0, 130}, std::pair{130, 1}, std::pair{131, 9}}) {
    Tensor part = filled({B, n, 3 * C}, 0.0f);
    for (int b = 0; b < B; b++)
      std::copy_n(q + (b * T + pos) * 3 * C, n * 3 * C, part.data<float>() + b * n * 3 * C);
    Tensor out = zeros({B, n, C});
    ops::flash_attention_cached(*stream_, out, kc, vc, on(part), pos);
    const Vec y = host(out);
    if (!skipped_.empty()) return;
    for (int b = 0; b < B; b++)
      for (int i = 0; i < n * C; i++)
        got[static_cast<std::size_t>((b * T + pos) * C + i)] =
            y[static_cast<std::size_t>(b * n * C + i)];
  }
  EXPECT_LT(rel_error(got, attention_ref(to_double(qkv), B, T, C, NH)), fwd_tol());
  const Vec k = host(kc), v = host(vc), qh = to_double(qkv);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        for (int e = 0; e < HS; e++) {
          const auto at = static_cast<std::size_t>(((b * NH + h) * Tc + t) * HS + e);
          ASSERT_EQ(k[at], qh[static_cast<std::size_t>((b * T + t) * 3 * C + C + h * HS + e)]);
          ASSERT_EQ(v[at], qh[static_cast<std::size_t>((b * T + t) * 3 * C + 2 * C + h * HS + e)]);
        }
}

// CUDA's flash kernels hold at most 256 of a head's dimensions: past that,
// refused by name (the CPU's have no such limit).
TEST_P(Fp32FlashAttentionTest, CudaRefusesHeadsOver256ByName) {
  if (std::get<0>(GetParam()) != "cuda") GTEST_SKIP() << "the CPU has no head size limit";
  const int B = 1, T = 4, C = 528, NH = 2;
  Tensor qkv = zeros({B, T, 3 * C}), out = zeros({B, T, C}), lse = zeros32({B, NH, T});
  ops::flash_attention_forward(*stream_, out, lse, qkv);
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("head size 264 is over the CUDA flash kernel's 256"),
            std::string::npos)
      << st;
}

TEST_P(Fp32FlashAttentionTest, ALseInTheComputeDtypeIsRefusedByName) {
  const int B = 1, T = 4, C = 8, NH = 2;
  Tensor qkv = zeros({B, T, 3 * C}), out = zeros({B, T, C});
  Tensor lse = Tensor::empty(*dev_, DType::kBF16, {B, NH, T});
  ops::flash_attention_forward(*stream_, out, lse, qkv);
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("flash_attention_forward"), std::string::npos) << st;
  EXPECT_NE(st.message().find("lse"), std::string::npos) << st;
}

// The backward's double reference is the gradient: central differences of
// attention_ref at a small shape.
TEST(FlashAttentionReference, BackwardIsTheNumericGradient) {
  const int B = 1, T = 5, C = 8, NH = 2;
  std::mt19937 rng(7);
  const Vec qkv = to_double(random_tensor(rng, {B, T, 3 * C}, 1.0f));
  const Vec dy = to_double(random_tensor(rng, {B, T, C}, 1.0f));
  auto f = [&](const Vec& v) { return attention_ref(v, B, T, C, NH); };
  EXPECT_LT(rel_error(attention_backward_ref(qkv, dy, B, T, C, NH), numeric_grad(f, qkv, dy)),
            1e-7);
}

INSTANTIATE_TEST_SUITE_P(Backends, FlashAttentionTest,
                         ::testing::Combine(::testing::Values("cpu", "cuda"),
                                            ::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Backends, Fp32FlashAttentionTest,
                         ::testing::Combine(::testing::Values("cpu", "cuda"),
                                            ::testing::Values(DType::kF32)),
                         param_name);

}  // namespace
}  // namespace troupe::testing
