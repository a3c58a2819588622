// The fused ops (gpu/kernels.h: the MLP's GEMM pair with GELU, the
// residual with its LayerNorm, AdamW writing the compute copies) against
// double references (the GEMM pair) or bitwise against the unfused ops
// (the others), on every backend and compute dtype (ops_fixture.h); on a
// GPU, that cuBLASLt's GELU epilogues did run.
#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <vector>

#include "gpu/host_values.h"
#include "gpu/ops.h"
#include "tests/gpu/ops_fixture.h"
#ifdef TROUPE_HAVE_CUDA
#include "gpu/cuda/cuda_matmul.h"
#endif

namespace troupe::testing {
namespace {

class FusedOpsTest : public OpsTest {};
class Fp32FusedOpsTest : public OpsTest {};  // the optimizer's ops and checks, in f32

// The MLP's fused pair (fc1 with GELU; fc2's backward through GELU) on two
// shapes: odd sizes, and distinct multiples of 8 (where CUDA takes
// cuBLASLt's GELU epilogues), with and without fc1's bias gradient.
TEST_P(FusedOpsTest, MatmulGeluPairMatchesTheReference) {
  struct Dims {
    int N, IC, H, OC;
  };
  for (const Dims d : {Dims{7, 12, 10, 6}, Dims{40, 24, 32, 8}}) {
    const int N = d.N, IC = d.IC, H = d.H, OC = d.OC;
    SCOPED_TRACE(absl::StrCat("N=", N, " IC=", IC, " H=", H, " OC=", OC));
    Tensor x = rnd({N, IC}), w1 = rnd({H, IC}, 0.5f), b1 = rnd({H});
    Tensor pre_in = rnd({N, H}, 2.0f), a_in = rnd({N, H}), w2 = rnd({OC, H}), r = rnd({N, OC});
    Tensor db1_0 = rnd({H}), dw2_0 = rnd({OC, H}), db2_0 = rnd({OC});
    for (bool with_db1 : {true, false}) {
      Tensor out = zeros({N, H}), pre = zeros({N, H}), dpre = zeros({N, H});
      Tensor db1 = on32(db1_0), dw2 = on32(dw2_0), db2 = on32(db2_0);
      ops::matmul_gelu_forward(*stream_, out, pre, on(x), on(w1), on(b1));
      ops::matmul_backward_gelu(*stream_, dpre, with_db1 ? db1 : Tensor{}, dw2, db2, on(r),
                                on(a_in), on(w2), on(pre_in));
      Vec y = host(out), p = host(pre), gp = host(dpre), gb1 = host(db1), gw2 = host(dw2),
          gb2 = host(db2);
      SKIP_IF_UNSUPPORTED();
      const Vec want_pre = matmul_ref(to_double(x), to_double(w1), to_double(b1), N, IC, H);
      EXPECT_LT(rel_error(p, want_pre), fwd_tol());
      EXPECT_LT(rel_error(y, gelu_ref(want_pre)), fwd_tol());
      const Vec ad = to_double(a_in), w2d = to_double(w2), rd = to_double(r);
      const Vec want_dpre =
          numeric_grad([&](const Vec& v) { return matmul_ref(gelu_ref(v), w2d, {}, N, H, OC); },
                       to_double(pre_in), rd);
      EXPECT_LT(rel_error(gp, want_dpre), bwd_tol());
      Vec want_db1 = to_double(db1_0), want_db2 = to_double(db2_0);
      if (with_db1) {
        for (int n = 0; n < N; n++)
          for (int h = 0; h < H; h++) want_db1[h] += want_dpre[n * H + h];
      }
      EXPECT_LT(rel_error(gb1, want_db1), bwd_tol());
      for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) want_db2[o] += rd[n * OC + o];
      EXPECT_LT(rel_error(gb2, want_db2), bwd_tol());
      Vec want_dw2 =
          numeric_grad([&](const Vec& v) { return matmul_ref(ad, v, {}, N, H, OC); }, w2d, rd);
      const Vec dw2_0d = to_double(dw2_0);
      for (std::size_t i = 0; i < want_dw2.size(); i++) want_dw2[i] += dw2_0d[i];
      EXPECT_LT(rel_error(gw2, want_dw2), bwd_tol());
    }
  }
}

// A pipeline's backward in two halves (B: the input gradient with the
// bias's; W: matmul_backward_weight) gives bitwise what the one call gives,
// for the plain linear layer and the one through GELU, and W's sum is
// dout^T . inp (against the double reference).
TEST_P(FusedOpsTest, TheBackwardSplitIntoInputAndWeightIsBitwiseTheWhole) {
  for (const auto& [N, IC, OC] : {std::tuple{7, 12, 6}, std::tuple{40, 24, 32}}) {
    SCOPED_TRACE(absl::StrCat("N=", N, " IC=", IC, " OC=", OC));
    Tensor x = rnd({N, IC}), w = rnd({OC, IC}), dout = rnd({N, OC}), pre = rnd({N, IC}, 2.0f);
    Tensor dw_0 = rnd({OC, IC}), db_0 = rnd({OC}), dpb_0 = rnd({IC});
    // Whole: one call each.
    Tensor dx = zeros({N, IC}), dw = on32(dw_0), db = on32(db_0);
    Tensor dpre = zeros({N, IC}), dpb = on32(dpb_0), dw2 = on32(dw_0), db2 = on32(db_0);
    ops::matmul_backward(*stream_, dx, dw, db, on(dout), on(x), on(w), gpu::Accumulate::kNo);
    ops::matmul_backward_gelu(*stream_, dpre, dpb, dw2, db2, on(dout), on(x), on(w), on(pre));
    // Split: B, then W.
    Tensor sx = zeros({N, IC}), sw = on32(dw_0), sb = on32(db_0);
    Tensor spre = zeros({N, IC}), spb = on32(dpb_0), sw2 = on32(dw_0), sb2 = on32(db_0);
    ops::matmul_backward(*stream_, sx, Tensor{}, sb, on(dout), on(x), on(w), gpu::Accumulate::kNo);
    ops::matmul_backward_gelu(*stream_, spre, spb, Tensor{}, sb2, on(dout), on(x), on(w), on(pre));
    ops::matmul_backward_weight(*stream_, sw, on(dout), on(x));
    ops::matmul_backward_weight(*stream_, sw2, on(dout), on(x));
    const Vec got_w = host(sw);
    SKIP_IF_UNSUPPORTED();
    EXPECT_TRUE(host(sx) == host(dx));
    EXPECT_TRUE(got_w == host(dw));
    EXPECT_TRUE(host(sb) == host(db));
    EXPECT_TRUE(host(spre) == host(dpre));
    EXPECT_TRUE(host(spb) == host(dpb));
    EXPECT_TRUE(host(sw2) == host(dw2));
    EXPECT_TRUE(host(sb2) == host(db2));
    const Vec xd = to_double(x), dd = to_double(dout);
    Vec want = numeric_grad([&](const Vec& v) { return matmul_ref(xd, v, {}, N, IC, OC); },
                            to_double(w), dd);
    const Vec w0 = to_double(dw_0);
    for (std::size_t i = 0; i < want.size(); i++) want[i] += w0[i];
    EXPECT_LT(rel_error(got_w, want), bwd_tol());
  }
}

TEST_P(Fp32FusedOpsTest, MatmulGeluForwardKeepsPreApartFromOut) {
  Tensor x = zeros({4, 8}), w = zeros({8, 8}), y = zeros({4, 8});
  ops::matmul_gelu_forward(*stream_, y, y, x, w, Tensor{});
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "matmul_gelu_forward: out and pre are the same tensor (pre is kept)");
}

// The fused pair bitwise the unfused one (residual, output, mean, rstd),
// and the output against the double reference of LayerNorm over a + b.
TEST_P(FusedOpsTest, ResidualLayerNormIsTheUnfusedPair) {
  const int N = 5, C = 40;
  Tensor a = rnd({N, C}), b = rnd({N, C}), w = rnd({C}), bias = rnd({C});
  Tensor residual = zeros({N, C}), out = zeros({N, C}), mean = zeros32({N}), rstd = zeros32({N});
  Tensor want_residual = zeros({N, C}), want_out = zeros({N, C}), want_mean = zeros32({N}),
         want_rstd = zeros32({N});
  ops::residual_layernorm_forward(*stream_, residual, out, mean, rstd, on(a), on(b), on(w),
                                  on(bias));
  ops::residual_forward(*stream_, want_residual, on(a), on(b));
  ops::layernorm_forward(*stream_, want_out, want_mean, want_rstd, want_residual, on(w), on(bias));
  const Vec y = host(out), r = host(residual), m = host(mean), rs = host(rstd);
  SKIP_IF_UNSUPPORTED();
  EXPECT_TRUE(r == host(want_residual));
  EXPECT_TRUE(y == host(want_out));
  EXPECT_TRUE(m == host(want_mean));
  EXPECT_TRUE(rs == host(want_rstd));
  Vec sum = to_double(a);
  const Vec bd = to_double(b);
  for (std::size_t i = 0; i < sum.size(); i++) sum[i] += bd[i];
  EXPECT_LT(rel_error(y, layernorm_ref(sum, to_double(w), to_double(bias), N, C)), fwd_tol());
}

TEST_P(Fp32FusedOpsTest, MatmulBackwardGeluRefusesAnOutputThatIsAnInput) {
  Tensor x = zeros({4, 8}), w = zeros({8, 8}), dout = zeros({4, 8}), dw = zeros32({8, 8});
  ops::matmul_backward_gelu(*stream_, x, Tensor{}, dw, Tensor{}, dout, x, w, zeros({4, 8}));
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "matmul_backward_gelu: dpre and inp are the same tensor");
}

// The compute copies written by the step equal the updated fp32 params
// rounded by ops::convert, in bf16 and f16, for tensors with and without a
// copy in one call (30 tensors: two launches on CUDA).
TEST_P(Fp32FusedOpsTest, AdamWManyWritesTheComputeCopies) {
  for (DType copy : {DType::kBF16, DType::kF16}) {
    std::vector<gpu::AdamWTensor> many;
    for (int i = 0; i < 30; i++) {
      const int n = i == 3 ? 5000 : 1 + i * 7;
      Tensor c = i % 3 == 2 ? Tensor{} : Tensor::empty(*dev_, copy, {n});
      many.push_back({on(rnd({n})), on(rnd({n})), zeros({n}), zeros({n}), 0.1f, c});
    }
    gpu::AdamWArgs a;
    a.lr = 0.01f;
    ops::adamw_many(*stream_, many, a);
    for (std::size_t i = 0; i < many.size(); i++) {
      if (!many[i].compute.defined()) continue;
      Tensor want = Tensor::empty(*dev_, copy, many[i].p.shape);
      ops::convert(*stream_, want, many[i].p);
      const Vec got_v = host(many[i].compute), want_v = host(want);
      SKIP_IF_UNSUPPORTED();
      ASSERT_TRUE(got_v == want_v) << gpu::dtype_name(copy) << " tensor " << i;
    }
  }
}

TEST_P(Fp32FusedOpsTest, AdamWManyWantsOneDtypeOfComputeCopies) {
  std::vector<gpu::AdamWTensor> t = {{zeros({4}), zeros({4}), zeros({4}), zeros({4}), 0.0f,
                                      Tensor::empty(*dev_, DType::kBF16, {4})},
                                     {zeros({4}), zeros({4}), zeros({4}), zeros({4}), 0.0f,
                                      Tensor::empty(*dev_, DType::kF16, {4})}};
  ops::adamw_many(*stream_, t, {});
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "adamw_many: compute[1] is f16[4], want bf16[4]");
}

#ifdef TROUPE_HAVE_CUDA
// On a GPU, at gpt2-124m's shapes (C 768, 4C 3072, 64 rows) in bf16 and
// fp16, the pair runs fused -- cuBLASLt's GELU_AUX_BIAS and DGELU
// epilogues, not the unfused fallback (which the reference tests above
// would pass too) -- and its outputs agree with the unfused ops' on the
// same GPU, within the one rounding they differ by (GELU reads the
// pre-activation before or after its rounding).
TEST(CudaFused, GeluEpiloguesRunInTheGemmsIn16Bits) {
  gpu::Device* dev = backend("cuda");
  if (dev == nullptr) GTEST_SKIP() << "cuda: " << no_cuda_reason();
  auto s = dev->make_stream({});
  const std::int64_t N = 64, C = 768, H = 4 * C;
  std::mt19937 rng(5);
  for (DType t : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(gpu::dtype_name(t));
    auto make = [&](DType d, const gpu::Shape& shape, float scale) {
      std::normal_distribution<float> normal(0.0f, scale);
      std::vector<float> v(static_cast<std::size_t>(gpu::shape_numel(shape)));
      for (float& x : v) x = scale == 0.0f ? 0.0f : normal(rng);
      Tensor x = Tensor::empty(*dev, d, shape);
      EXPECT_TRUE(gpu::copy_values_to_device(v, x).ok());
      return x;
    };
    auto values = [&](const Tensor& x) {
      std::vector<float> v(static_cast<std::size_t>(x.numel()));
      EXPECT_TRUE(gpu::copy_values_to_host(x, v).ok());
      return Vec(v.begin(), v.end());
    };
    const Tensor x = make(t, {N, C}, 1.0f), w1 = make(t, {H, C}, 0.05f), b1 = make(t, {H}, 0.1f),
                 w2 = make(t, {C, H}, 0.05f), dout = make(t, {N, C}, 1.0f);
    // fused: a = gelu(pre), then dpre, db1, dw2, db2
    Tensor a = make(t, {N, H}, 0), pre = make(t, {N, H}, 0), dpre = make(t, {N, H}, 0);
    Tensor db1 = make(DType::kF32, {H}, 0), dw2 = make(DType::kF32, {C, H}, 0),
           db2 = make(DType::kF32, {C}, 0);
    const gpu::cuda::GeluEpilogueCounts before = gpu::cuda::gelu_epilogue_counts();
    ops::matmul_gelu_forward(*s, a, pre, x, w1, b1);
    ops::matmul_backward_gelu(*s, dpre, db1, dw2, db2, dout, a, w2, pre);
    const absl::Status st = s->synchronize();
    ASSERT_TRUE(st.ok()) << st;
    const gpu::cuda::GeluEpilogueCounts after = gpu::cuda::gelu_epilogue_counts();
    EXPECT_EQ(after.forward_fused - before.forward_fused, 1);
    EXPECT_EQ(after.backward_fused - before.backward_fused, 1);
    EXPECT_EQ(after.forward_unfused, before.forward_unfused);
    EXPECT_EQ(after.backward_unfused, before.backward_unfused);
    // unfused, from the same inputs (the backward from the fused forward's a and pre)
    Tensor a2 = make(t, {N, H}, 0), pre2 = make(t, {N, H}, 0), dpre2 = make(t, {N, H}, 0);
    Tensor db1_2 = make(DType::kF32, {H}, 0), dw2_2 = make(DType::kF32, {C, H}, 0),
           db2_2 = make(DType::kF32, {C}, 0);
    ops::matmul_forward(*s, pre2, x, w1, b1);
    ops::gelu_forward(*s, a2, pre2);
    ops::matmul_backward(*s, dpre2, dw2_2, db2_2, dout, a, w2, Accumulate::kNo);
    ops::gelu_backward(*s, dpre2, pre, dpre2);
    ops::bias_backward(*s, db1_2, dpre2);
    ASSERT_TRUE(s->synchronize().ok());
    const double tol = t == DType::kBF16 ? 2e-2 : 4e-3;
    EXPECT_LT(rel_error(values(pre), values(pre2)), tol);
    EXPECT_LT(rel_error(values(a), values(a2)), tol);
    EXPECT_LT(rel_error(values(dpre), values(dpre2)), tol);
    EXPECT_LT(rel_error(values(db1), values(db1_2)), tol);
    EXPECT_TRUE(values(dw2) == values(dw2_2));  // the same GEMM, the same algorithm
    EXPECT_TRUE(values(db2) == values(db2_2));
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(Backends, FusedOpsTest,
                         ::testing::Combine(::testing::Values("cpu", "cuda"),
                                            ::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Backends, Fp32FusedOpsTest,
                         ::testing::Combine(::testing::Values("cpu", "cuda"),
                                            ::testing::Values(DType::kF32)),
                         param_name);

}  // namespace
}  // namespace troupe::testing
