// The cross-backend op test: every backend present computes each op on the
// same random inputs, in each compute dtype (f32, bf16, f16: the test's
// name says which); forwards are compared with the double references of
// reference_ops.h, backwards with central finite differences of them (in
// double), within a tolerance of the dtype. Inputs are drawn representable
// in the dtype, so the reference sees exactly what the op reads. A backend
// that lacks an op is reported as skipped, never passed.
#include "gpu/ops.h"

#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gpu/precision.h"
#include "tests/gpu/backends.h"
#include "tests/gpu/reference_ops.h"
#include "tests/test_util.h"

namespace troupe::gpu {
// ctest names the dtype of a case ("bf16"), not its byte.
void PrintTo(DType d, std::ostream* os) { *os << dtype_name(d); }
}  // namespace troupe::gpu

namespace troupe::testing {
namespace {

using gpu::Accumulate;
using gpu::DType;
using gpu::Tensor;
namespace ops = gpu::ops;

// Norm-wise tolerances against double: fp32 ops; bf16/f16 ops, whose every
// stored value is rounded to 8 (bf16) or 11 (f16) significant bits (relative
// error up to 2^-9 and 2^-12 each, a few roundings per op).
double fwd_tol(DType d) { return d == DType::kBF16 ? 1e-2 : d == DType::kF16 ? 2e-3 : 1e-5; }
double bwd_tol(DType d) { return d == DType::kBF16 ? 3e-2 : d == DType::kF16 ? 5e-3 : 1e-4; }

// A host copy of the device tensor `t` in f32, after `s` has finished:
// bf16/f16 tensors are converted on the device first (exact).
absl::StatusOr<Tensor> host_f32(gpu::Device& dev, gpu::Stream& s, const Tensor& t) {
  Tensor f = t;
  if (t.dtype != DType::kF32) {
    f = Tensor::empty(dev, DType::kF32, t.shape);
    ops::convert(s, f, t);
  }
  if (absl::Status st = s.synchronize(); !st.ok()) return st;
  Tensor h = Tensor::empty(gpu::cpu_device(), DType::kF32, t.shape);
  if (absl::Status st = dev.copy_to_host(f, h.raw()); !st.ok()) return st;
  return h;
}

class OpsTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override {
    dev_ = backend(std::get<0>(GetParam()));
    A_ = std::get<1>(GetParam());
    if (dev_ == nullptr) GTEST_SKIP() << std::get<0>(GetParam()) << ": " << no_cuda_reason();
    stream_ = dev_->make_stream({.threads = 2});
  }
  // A host f32 tensor of N(0, scale^2) values representable in the dtype.
  Tensor rnd(const gpu::Shape& shape, float scale = 1.0f) {
    Tensor t = random_tensor(rng_, shape, scale);
    const gpu::Precision p = gpu::dtype_precision(A_);
    for (std::int64_t i = 0; i < t.numel(); i++) {
      t.data<float>()[i] = gpu::round_to(t.data<float>()[i], p);
    }
    return t;
  }
  // A copy of host f32 tensor `t` on the device, in the dtype (on) or f32
  // (on32); i32 tensors as they are.
  Tensor on32(const Tensor& t) {
    Tensor d = Tensor::empty(*dev_, t.dtype, t.shape);
    EXPECT_TRUE(dev_->copy_from_host(t.raw(), d).ok());
    return d;
  }
  Tensor on(const Tensor& t) {
    Tensor f = on32(t);
    if (t.dtype != DType::kF32 || A_ == DType::kF32) return f;
    Tensor d = Tensor::empty(*dev_, A_, t.shape);
    ops::convert(*stream_, d, f);
    return d;
  }
  Tensor zeros(const gpu::Shape& shape) { return on(filled(shape, 0.0f)); }
  Tensor zeros32(const gpu::Shape& shape) { return on32(filled(shape, 0.0f)); }
  // Host doubles of a device tensor, after the stream has finished. Skips
  // the test when the backend lacks an op that ran.
  Vec host(const Tensor& t) {
    absl::StatusOr<Tensor> h = host_f32(*dev_, *stream_, t);
    if (!h.ok() && absl::IsUnimplemented(h.status())) {
      skipped_ = std::string(h.status().message());
      return Vec(static_cast<std::size_t>(t.numel()), 0.0);
    }
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? to_double(*h) : Vec(static_cast<std::size_t>(t.numel()), 0.0);
  }
  bool unsupported() {
    if (skipped_.empty()) return false;
    std::cout << "[ UNSUPPORTED ] " << skipped_ << "\n";
    return true;
  }
  double fwd_tol() const { return testing::fwd_tol(A_); }
  double bwd_tol() const { return testing::bwd_tol(A_); }
  gpu::Device* dev_ = nullptr;
  DType A_ = DType::kF32;
  std::unique_ptr<gpu::Stream> stream_;
  std::mt19937 rng_{42};
  std::string skipped_;
};

// The optimizer's ops (fp32 master, moments, main gradients) and the
// argument checks' messages, in f32 only.
class Fp32OpsTest : public OpsTest {};

#define SKIP_IF_UNSUPPORTED() \
  if (unsupported()) GTEST_SKIP() << skipped_

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

// The MLP's fused pair (fc1 with GELU; fc2's backward through GELU) on two
// shapes: odd sizes, and multiples of 8 (where CUDA takes cuBLASLt's GELU
// epilogues), with and without fc1's bias gradient.
TEST_P(OpsTest, MatmulGeluPairMatchesTheReference) {
  struct Dims {
    int N, IC, H, OC;
  };
  for (const Dims d : {Dims{7, 12, 10, 6}, Dims{16, 16, 24, 16}}) {
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

TEST_P(Fp32OpsTest, MatmulGeluForwardKeepsPreApartFromOut) {
  Tensor x = zeros({4, 8}), w = zeros({8, 8}), y = zeros({4, 8});
  ops::matmul_gelu_forward(*stream_, y, y, x, w, Tensor{});
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "matmul_gelu_forward: out and pre are the same tensor (pre is kept)");
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

// The compute copies written by the step equal the updated fp32 params
// rounded by ops::convert, in bf16 and f16, for tensors with and without a
// copy in one call (30 tensors: two launches on CUDA).
TEST_P(Fp32OpsTest, AdamWManyWritesTheComputeCopies) {
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

TEST_P(Fp32OpsTest, AdamWManyWantsOneDtypeOfComputeCopies) {
  std::vector<gpu::AdamWTensor> t = {{zeros({4}), zeros({4}), zeros({4}), zeros({4}), 0.0f,
                                      Tensor::empty(*dev_, DType::kBF16, {4})},
                                     {zeros({4}), zeros({4}), zeros({4}), zeros({4}), 0.0f,
                                      Tensor::empty(*dev_, DType::kF16, {4})}};
  ops::adamw_many(*stream_, t, {});
  const absl::Status st = stream_->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "adamw_many: compute[1] is f16[4], want bf16[4]");
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

// "cpu_bf16", "cuda_f32", ...: gtest_list_tests names each backend and dtype.
std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
  return absl::StrCat(std::get<0>(info.param), "_", gpu::dtype_name(std::get<1>(info.param)));
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
