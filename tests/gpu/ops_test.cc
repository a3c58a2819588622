// The cross-backend op test: every backend present computes each op on the
// same random inputs, in each compute dtype (f32, bf16, f16: the test's
// name says which); forwards are compared with the double references of
// reference_ops.h, backwards with central finite differences of them (in
// double), within a tolerance of the dtype. Inputs are drawn representable
// in the dtype, so the reference sees exactly what the op reads. A backend
// that lacks an op is reported as skipped, never passed. The fused ops'
// cases: fused_ops_test.cc.
#include "gpu/ops.h"

#include <gtest/gtest.h>

#include "tests/gpu/ops_fixture.h"

namespace troupe::testing {
namespace {

TEST_P(OpsTest, Embedding) {
  const int B = 2, T = 5, C = 8, Vp = 11;
  std::vector<std::int32_t> tok = {0, 3, 3, 10, 7, 1, 2, 3, 9, 3};
  Tensor wte = rnd({Vp, C}), wpe = rnd({T + 2, C});
  Tensor r = rnd({B, T, C});
  Tensor out = zeros({B, T, C}), dwte = zeros32({Vp, C}), dwpe = zeros32({T + 2, C});
  Tensor tokens = on(int_tensor(tok, {B, T}));
  ops::embedding_forward(*stream_, out, tokens, on(wte), on(wpe));
  ops::embedding_backward(*stream_, dwte, dwpe, on(r), tokens);
  Vec y = host(out), gte = host(dwte), gpe = host(dwpe);
  SKIP_IF_UNSUPPORTED();
  Vec wte_d = to_double(wte), wpe_d = to_double(wpe), r_d = to_double(r);
  EXPECT_LT(rel_error(y, embedding_ref(tok, wte_d, wpe_d, B, T, C)), fwd_tol());
  auto f_te = [&](const Vec& x) { return embedding_ref(tok, x, wpe_d, B, T, C); };
  auto f_pe = [&](const Vec& x) { return embedding_ref(tok, wte_d, x, B, T, C); };
  EXPECT_LT(rel_error(gte, numeric_grad(f_te, wte_d, r_d)), bwd_tol());
  EXPECT_LT(rel_error(gpe, numeric_grad(f_pe, wpe_d, r_d)), bwd_tol());
}

TEST_P(OpsTest, EmbeddingRejectsTokenOutOfRange) {
  Tensor out = zeros({1, 2, 4});
  ops::embedding_forward(*stream_, out, on(int_tensor({1, 6}, {1, 2})), zeros({6, 4}),
                         zeros({2, 4}));
  absl::Status st = stream_->synchronize();
  if (absl::IsUnimplemented(st)) GTEST_SKIP() << st;
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("token id"), absl::string_view::npos) << st;
}

TEST_P(OpsTest, LayerNorm) {
  const int N = 6, C = 40;
  Tensor x = rnd({N, C}, 2.0f), w = rnd({C}), b = rnd({C}), r = rnd({N, C});
  Tensor out = zeros({N, C}), mean = zeros32({N}), rstd = zeros32({N});
  Tensor dx0 = rnd({N, C});  // the backward adds to what is there
  Tensor dx = on(dx0), dw = zeros32({C}), db = zeros32({C});
  ops::layernorm_forward(*stream_, out, mean, rstd, on(x), on(w), on(b));
  ops::layernorm_backward(*stream_, dx, dw, db, on(r), on(x), on(w), mean, rstd);
  Vec y = host(out), gx = host(dx), gw = host(dw), gb = host(db);
  SKIP_IF_UNSUPPORTED();
  Vec xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);
  EXPECT_LT(rel_error(y, layernorm_ref(xd, wd, bd, N, C)), fwd_tol());
  Vec want_dx = numeric_grad([&](const Vec& v) { return layernorm_ref(v, wd, bd, N, C); }, xd, rd);
  Vec dx0d = to_double(dx0);
  for (std::size_t i = 0; i < want_dx.size(); i++) want_dx[i] += dx0d[i];
  EXPECT_LT(rel_error(gx, want_dx), bwd_tol());
  EXPECT_LT(rel_error(gw, numeric_grad([&](const Vec& v) { return layernorm_ref(xd, v, bd, N, C); },
                                       wd, rd)),
            bwd_tol());
  EXPECT_LT(rel_error(gb, numeric_grad([&](const Vec& v) { return layernorm_ref(xd, wd, v, N, C); },
                                       bd, rd)),
            bwd_tol());
}

TEST_P(OpsTest, MatmulSmall) {
  const int N = 7, IC = 12, OC = 10;
  Tensor x = rnd({N, IC}), w = rnd({OC, IC}), bias = rnd({OC}), r = rnd({N, OC});
  Tensor dx0 = rnd({N, IC}), dw0 = rnd({OC, IC}), db0 = rnd({OC});
  for (Accumulate mode : {Accumulate::kNo, Accumulate::kYes}) {
    for (bool has_bias : {true, false}) {
      // dw and db are the fp32 main gradients, added into.
      Tensor out = zeros({N, OC}), dx = on(dx0), dw = on32(dw0), db = on32(db0);
      Tensor bias_d = has_bias ? on(bias) : Tensor{};
      ops::matmul_forward(*stream_, out, on(x), on(w), bias_d);
      ops::matmul_backward(*stream_, dx, dw, has_bias ? db : Tensor{}, on(r), on(x), on(w), mode);
      Vec y = host(out), gx = host(dx), gw = host(dw), gb = host(db);
      SKIP_IF_UNSUPPORTED();
      Vec xd = to_double(x), wd = to_double(w), bd = has_bias ? to_double(bias) : Vec{},
          rd = to_double(r);
      EXPECT_LT(rel_error(y, matmul_ref(xd, wd, bd, N, IC, OC)), fwd_tol());
      Vec want_dx =
          numeric_grad([&](const Vec& v) { return matmul_ref(v, wd, bd, N, IC, OC); }, xd, rd);
      Vec want_dw =
          numeric_grad([&](const Vec& v) { return matmul_ref(xd, v, bd, N, IC, OC); }, wd, rd);
      Vec dx0d = to_double(dx0), dw0d = to_double(dw0), db0d = to_double(db0);
      for (std::size_t i = 0; i < want_dx.size(); i++) {
        if (mode == Accumulate::kYes) want_dx[i] += dx0d[i];
      }
      for (std::size_t i = 0; i < want_dw.size(); i++) want_dw[i] += dw0d[i];  // always adds
      EXPECT_LT(rel_error(gx, want_dx), bwd_tol());
      EXPECT_LT(rel_error(gw, want_dw), bwd_tol());
      if (has_bias) {
        Vec want_db =
            numeric_grad([&](const Vec& v) { return matmul_ref(xd, wd, v, N, IC, OC); }, bd, rd);
        for (std::size_t i = 0; i < want_db.size(); i++) want_db[i] += db0d[i];
        EXPECT_LT(rel_error(gb, want_db), bwd_tol());
      }
    }
  }
}

TEST_P(OpsTest, MatmulLargerThanChunks) {
  // Sizes past the kernels' row/column chunks, forward and dbias only.
  const int N = 130, IC = 70, OC = 150;
  Tensor x = rnd({N, IC}), w = rnd({OC, IC}), bias = rnd({OC}), r = rnd({N, OC});
  Tensor out = zeros({N, OC}), dx = zeros({N, IC}), dw = zeros32({OC, IC}), db = zeros32({OC});
  ops::matmul_forward(*stream_, out, on(x), on(w), on(bias));
  ops::matmul_backward(*stream_, dx, dw, db, on(r), on(x), on(w), Accumulate::kNo);
  Vec y = host(out), gb = host(db);
  SKIP_IF_UNSUPPORTED();
  EXPECT_LT(rel_error(y, matmul_ref(to_double(x), to_double(w), to_double(bias), N, IC, OC)),
            fwd_tol());
  Vec want(OC, 0.0), rd = to_double(r);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) want[o] += rd[n * OC + o];
  EXPECT_LT(rel_error(gb, want), testing::fwd_tol(DType::kF32));  // sums of exact values
}

TEST_P(OpsTest, Gelu) {
  const int n = 1000;
  Tensor x = rnd({n}, 3.0f), r = rnd({n});
  Tensor out = zeros({n}), dx = zeros({n});
  ops::gelu_forward(*stream_, out, on(x));
  ops::gelu_backward(*stream_, dx, on(x), on(r));
  Vec y = host(out), gx = host(dx);
  SKIP_IF_UNSUPPORTED();
  Vec xd = to_double(x);
  EXPECT_LT(rel_error(y, gelu_ref(xd)), fwd_tol());
  EXPECT_LT(rel_error(gx, numeric_grad(gelu_ref, xd, to_double(r))), bwd_tol());
}

TEST_P(OpsTest, Attention) {
  const int B = 2, T = 6, C = 8, NH = 2;
  Tensor qkv = rnd({B, T, 3 * C}), r = rnd({B, T, C});
  Tensor out = zeros({B, T, C}), att = zeros({B, NH, T, T});
  Tensor dqkv = zeros({B, T, 3 * C}), datt = zeros({B, NH, T, T});
  Tensor qkv_d = on(qkv);
  ops::attention_forward(*stream_, out, att, qkv_d);
  ops::attention_backward(*stream_, dqkv, datt, on(r), qkv_d, att);
  Vec y = host(out), a = host(att), g = host(dqkv);
  SKIP_IF_UNSUPPORTED();
  Vec qd = to_double(qkv), want_att;
  EXPECT_LT(rel_error(y, attention_ref(qd, B, T, C, NH, &want_att)), fwd_tol());
  EXPECT_LT(rel_error(a, want_att), fwd_tol());
  auto f = [&](const Vec& v) { return attention_ref(v, B, T, C, NH); };
  EXPECT_LT(rel_error(g, numeric_grad(f, qd, to_double(r))), bwd_tol());
}

// Generation's KV-cached attention, fed the positions in chunks (a prompt
// of 3, one token, then 3 more), equals causal attention over the whole
// sequence, and leaves every position's k and v in the caches.
TEST_P(OpsTest, AttentionCachedEqualsCausalAttentionInChunks) {
  const int B = 2, T = 7, C = 8, NH = 2, HS = C / NH, Tc = 9;
  Tensor qkv = rnd({B, T, 3 * C});
  Tensor kc = zeros({B, NH, Tc, HS}), vc = zeros({B, NH, Tc, HS});
  const float* q = qkv.data<float>();
  Vec got(static_cast<std::size_t>(B) * T * C, 0.0);
  for (auto [pos, n] : {std::pair{0, 3}, std::pair{3, 1}, std::pair{4, 3}}) {
    Tensor part = filled({B, n, 3 * C}, 0.0f);
    for (int b = 0; b < B; b++)
      std::copy_n(q + (b * T + pos) * 3 * C, n * 3 * C, part.data<float>() + b * n * 3 * C);
    Tensor out = zeros({B, n, C}), att = zeros({B, NH, n, Tc});
    ops::attention_cached(*stream_, out, att, kc, vc, on(part), pos);
    const Vec y = host(out);
    SKIP_IF_UNSUPPORTED();
    for (int b = 0; b < B; b++)
      for (int i = 0; i < n * C; i++)
        got[static_cast<std::size_t>((b * T + pos) * C + i)] =
            y[static_cast<std::size_t>(b * n * C + i)];
  }
  EXPECT_LT(rel_error(got, attention_ref(to_double(qkv), B, T, C, NH)), fwd_tol());
  const Vec k = host(kc), v = host(vc);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        for (int e = 0; e < HS; e++) {
          const auto at = static_cast<std::size_t>(((b * NH + h) * Tc + t) * HS + e);
          ASSERT_EQ(k[at], q[(b * T + t) * 3 * C + C + h * HS + e]);
          ASSERT_EQ(v[at], q[(b * T + t) * 3 * C + 2 * C + h * HS + e]);
        }
}

TEST_P(OpsTest, AttentionCachedRejectsPositionsPastTheCache) {
  const int B = 1, C = 8, NH = 2, Tc = 4;
  Tensor kc = zeros({B, NH, Tc, C / NH}), vc = zeros({B, NH, Tc, C / NH});
  Tensor qkv = zeros({B, 2, 3 * C}), out = zeros({B, 2, C}), att = zeros({B, NH, 2, Tc});
  ops::attention_cached(*stream_, out, att, kc, vc, qkv, 3);
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("attention_cached"), std::string::npos) << st;
  EXPECT_NE(st.message().find("outside the cache"), std::string::npos) << st;
}

TEST_P(OpsTest, Residual) {
  Tensor a = rnd({3, 50}), b = rnd({3, 50}), out = zeros({3, 50});
  ops::residual_forward(*stream_, out, on(a), on(b));
  Vec y = host(out);
  SKIP_IF_UNSUPPORTED();
  Vec want = to_double(a), bd = to_double(b);
  for (std::size_t i = 0; i < want.size(); i++) want[i] += bd[i];
  EXPECT_LT(rel_error(y, want), A_ == DType::kF32 ? 1e-7 : fwd_tol());
}

TEST_P(OpsTest, CrossEntropyIgnoresVocabularyPadding) {
  const int N = 5, V = 13, Vp = 16;
  Tensor logits = rnd({N, Vp}, 2.0f);
  for (int n = 0; n < N; n++)
    for (int j = V; j < Vp; j++) logits.data<float>()[n * Vp + j] = 1e4f;  // must not matter
  std::vector<std::int32_t> tg = {0, 12, 5, 5, 7};
  Tensor targets = on(int_tensor(tg, {N}));
  Tensor losses = zeros32({N}), lse = zeros32({N}), lg = on(logits);
  const float dloss = 0.37f;
  ops::crossentropy_forward(*stream_, losses, lse, lg, targets, V);
  Vec l = host(losses);
  ops::crossentropy_backward(*stream_, lg, lg, lse, targets, dloss, V);  // in place
  Vec d = host(lg);
  SKIP_IF_UNSUPPORTED();
  Vec xd = to_double(logits);
  EXPECT_LT(rel_error(l, crossentropy_ref(xd, tg, N, V, Vp)), fwd_tol());
  Vec r(N, dloss);
  Vec want = numeric_grad([&](const Vec& v) { return crossentropy_ref(v, tg, N, V, Vp); }, xd, r);
  EXPECT_LT(rel_error(d, want), bwd_tol());
  for (int n = 0; n < N; n++)
    for (int j = V; j < Vp; j++) EXPECT_EQ(d[n * Vp + j], 0.0);
}

TEST_P(OpsTest, CrossEntropyRejectsTargetInPadding) {
  Tensor losses = zeros32({1}), lse = zeros32({1});
  ops::crossentropy_forward(*stream_, losses, lse, zeros({1, 16}), on(int_tensor({13}, {1})), 13);
  absl::Status st = stream_->synchronize();
  if (absl::IsUnimplemented(st)) GTEST_SKIP() << st;
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
}

TEST_P(Fp32OpsTest, SquaredNorm) {
  const int n = 3 * 16384 + 5;  // across the fixed chunks
  Tensor x = rnd({n});
  Tensor out = Tensor::empty(*dev_, gpu::DType::kF64, {1});
  ops::squared_norm(*stream_, out, on(x));
  absl::Status st = stream_->synchronize();
  if (absl::IsUnimplemented(st)) GTEST_SKIP() << st;
  double got = 0;
  ASSERT_TRUE(dev_->copy_to_host(out, &got).ok());
  double want = 0;
  for (double v : to_double(x)) want += v * v;
  EXPECT_NEAR(got, want, 1e-9 * want);
}

TEST_P(Fp32OpsTest, AdamWMatchesTheFormula) {
  const int n = 37;
  Tensor p = rnd({n}), g = rnd({n});
  Tensor pd = on(p), m = zeros({n}), v = zeros({n});
  gpu::AdamWArgs a{.lr = 0.01f,
                   .beta1 = 0.9f,
                   .beta2 = 0.95f,
                   .eps = 1e-8f,
                   .weight_decay = 0.1f,
                   .step = 1,
                   .grad_scale = 0.5f};
  Vec want_p = to_double(p), gd = to_double(g), mm(n, 0.0), vv(n, 0.0);
  for (int step = 1; step <= 3; step++) {
    a.step = step;
    ops::adamw(*stream_, pd, on(g), m, v, a);
    for (int i = 0; i < n; i++) {
      const double gi = gd[i] * a.grad_scale;
      mm[i] = 0.9 * mm[i] + 0.1 * gi;
      vv[i] = 0.95 * vv[i] + 0.05 * gi * gi;
      const double mhat = mm[i] / (1 - std::pow(0.9, step));
      const double vhat = vv[i] / (1 - std::pow(0.95, step));
      want_p[i] = want_p[i] * (1 - 0.01 * 0.1) - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  Vec got = host(pd);
  SKIP_IF_UNSUPPORTED();
  EXPECT_LT(rel_error(got, want_p), 1e-6);
}

// Many tensors at once (more than one CUDA launch's table of 24, one of them
// larger than a block's chunk, each with its own decay) equal adamw per
// tensor, bit for bit.
TEST_P(Fp32OpsTest, AdamWManyEqualsAdamWPerTensor) {
  std::vector<gpu::AdamWTensor> many, one;
  for (int i = 0; i < 30; i++) {
    const int n = i == 3 ? 5000 : 1 + i * 7;
    Tensor p = rnd({n}), g = rnd({n});
    const float decay = i % 2 == 0 ? 0.1f : 0.0f;
    many.push_back({on(p), on(g), zeros({n}), zeros({n}), decay, Tensor{}});
    one.push_back({on(p), on(g), zeros({n}), zeros({n}), decay, Tensor{}});
  }
  gpu::AdamWArgs a;
  a.lr = 0.01f;
  a.weight_decay = 0.5f;  // not used: each tensor has its own
  a.grad_scale = 0.7f;
  for (int step = 1; step <= 2; step++) {
    a.step = step;
    ops::adamw_many(*stream_, many, a);
    for (const gpu::AdamWTensor& t : one) {
      gpu::AdamWArgs b = a;
      b.weight_decay = t.weight_decay;
      ops::adamw(*stream_, t.p, t.g, t.m, t.v, b);
    }
  }
  for (std::size_t i = 0; i < many.size(); i++) {
    const Vec got = host(many[i].p), want = host(one[i].p);
    SKIP_IF_UNSUPPORTED();
    ASSERT_TRUE(got == want) << "tensor " << i;
    ASSERT_TRUE(host(many[i].v) == host(one[i].v)) << "tensor " << i;
  }
}

TEST_P(Fp32OpsTest, AdamWManyNamesTheTensorWithTheBadShape) {
  std::vector<gpu::AdamWTensor> t = {
      {zeros({4}), zeros({4}), zeros({4}), zeros({4}), 0.0f, Tensor{}},
      {zeros({4}), zeros({3}), zeros({4}), zeros({4}), 0.0f, Tensor{}}};
  gpu::AdamWArgs a;
  a.lr = 0.1f;
  ops::adamw_many(*stream_, t, a);
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "adamw_many: g[1] is f32[3], want f32[4]");
}

TEST_P(OpsTest, FillAndAxpy) {
  Tensor y = zeros({100}), x = rnd({100});
  ops::fill(*stream_, y, 2.0f);
  ops::axpy(*stream_, y, -3.0f, on(x));
  Vec got = host(y);
  SKIP_IF_UNSUPPORTED();
  Vec want = to_double(x);
  for (double& w : want) w = 2.0 - 3.0 * static_cast<float>(w);
  EXPECT_LT(rel_error(got, want), A_ == DType::kF32 ? 1e-7 : fwd_tol());
}

// An op's tensors share its compute dtype; the error names the one that
// does not (here an f32 LayerNorm weight with bf16/f16 activations).
TEST_P(OpsTest, ATensorOfAnotherDtypeIsNamed) {
  if (A_ == DType::kF32) GTEST_SKIP() << "needs a 16-bit compute dtype";
  Tensor x = zeros({4, 8});
  ops::layernorm_forward(*stream_, zeros({4, 8}), zeros32({4}), zeros32({4}), x, zeros32({8}),
                         zeros({8}));
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(),
            absl::StrCat("layernorm_forward: w is f32[8], want ", gpu::dtype_name(A_), "[8]"));
}

// A zero-width last dimension is an error, not a division by zero (regression).
TEST_P(Fp32OpsTest, EmptyLastDimensionIsAnError) {
  Tensor x = zeros({4, 1}).view(0, {4, 0});
  ops::layernorm_forward(*stream_, x, zeros({4}), zeros({4}), x, zeros({1}).view(0, {0}),
                         zeros({1}).view(0, {0}));
  absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("empty last dimension"), absl::string_view::npos) << st;
}

TEST_P(Fp32OpsTest, BadShapeIsAStickyErrorNamingTheOp) {
  Tensor out = zeros({4, 8}), mean = zeros({4}), rstd = zeros({4});
  ops::layernorm_forward(*stream_, out, mean, rstd, zeros({4, 8}), zeros({7}), zeros({8}));
  ops::fill(*stream_, out, 1.0f);  // skipped: the stream has failed
  absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "layernorm_forward: w is f32[7], want f32[8]");
}

INSTANTIATE_TEST_SUITE_P(Backends, OpsTest,
                         ::testing::Combine(::testing::Values("cpu", "cuda"),
                                            ::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Backends, Fp32OpsTest,
                         ::testing::Combine(::testing::Values("cpu", "cuda"),
                                            ::testing::Values(DType::kF32)),
                         param_name);

}  // namespace
}  // namespace troupe::testing
