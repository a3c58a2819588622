// Backends against each other, at a transformer block's shapes: every op of
// gpu/kernels.h in the order a training step runs them (forward, loss,
// backward, norm, optimizer), plus the vocab-parallel loss, a rank's slice of
// the vocabulary (embedding both ways, the loss's backward) and the KV-cached
// attention. The op suite (ops_test.cc) checks each backend against double
// references at small shapes; this one checks
// - that each backend is bitwise repeatable (two runs, equal bits), and
// - where a GPU is present, that CUDA equals the CPU reference within fp32
//   rounding at sizes where the kernels' blocking and cuBLASLt's algorithms
//   matter (several warps per row, unaligned views), and
// - that a fault in an op's data skips the stream's later ops and reaches a
//   host callback, and that streams keep gpu/device.h's contract (events
//   order streams, callbacks run after errors, a throwing callback fails its
//   stream), on every backend.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpu/ops.h"
#include "tests/gpu/backends.h"
#include "tests/test_util.h"

namespace troupe::testing {
namespace {

using gpu::Tensor;
namespace ops = gpu::ops;
using Vec = std::vector<double>;

constexpr int B = 2, T = 64, C = 128, NH = 4, V = 500, Vp = 512, N = B * T;

struct Output {
  std::string name;
  Vec values;
};

// One block's step on `dev`, from inputs drawn with a fixed seed; the host
// copies of everything it computed.
std::vector<Output> run_block(gpu::Device& dev) {
  std::mt19937 rng(7);
  std::unique_ptr<gpu::Stream> s = dev.make_stream({.threads = 2});
  auto on = [&](const Tensor& t) {
    Tensor d = Tensor::empty(dev, t.dtype, t.shape);
    EXPECT_TRUE(dev.copy_from_host(t.raw(), d).ok());
    return d;
  };
  auto rnd = [&](const gpu::Shape& shape, float scale) {
    return on(random_tensor(rng, shape, scale));
  };
  auto zeros = [&](const gpu::Shape& shape) { return on(filled(shape, 0.0f)); };
  std::vector<std::int32_t> tok(N), tgt(N);
  std::uniform_int_distribution<std::int32_t> id(0, V - 1);
  for (int i = 0; i < N; i++) {
    tok[i] = id(rng) % 40;  // repeated ids: the embedding backward's order matters
    tgt[i] = id(rng);
  }
  const Tensor tokens = on(int_tensor(tok, {B, T})), targets = on(int_tensor(tgt, {N}));
  Tensor wte = rnd({Vp, C}, 0.02f), wpe = rnd({T, C}, 0.01f);
  Tensor lnw = rnd({C}, 1.0f), lnb = rnd({C}, 0.1f);
  // The qkv bias is a view 4 bytes into its buffer, as a bias in a flat
  // parameter buffer can be: cuBLASLt's bias epilogue cannot take it.
  Tensor wqkv = rnd({3 * C, C}, 0.05f), bqkv = rnd({3 * C + 1}, 0.02f).view(1, {3 * C});
  Tensor wfc = rnd({4 * C, C}, 0.05f), bfc = rnd({4 * C}, 0.02f);
  Tensor wproj = rnd({C, 4 * C}, 0.05f), bproj = rnd({C}, 0.02f);

  // Forward. The attention output is read through a view one element into
  // a larger buffer: GEMM operands that are not 16-byte aligned.
  Tensor emb = zeros({B, T, C}), ln = zeros({N, C}), mean = zeros({N}), rstd = zeros({N});
  Tensor qkv = zeros({B, T, 3 * C}), att = zeros({B, NH, T, T});
  Tensor att_buf = zeros({N * C + 1});
  Tensor att_out = att_buf.view(1, {B, T, C});
  Tensor h = zeros({N, 4 * C}), g = zeros({N, 4 * C}), proj = zeros({N, C}), res = zeros({N, C});
  Tensor logits = zeros({N, Vp}), losses = zeros({N}), lse = zeros({N});
  ops::embedding_forward(*s, emb, tokens, wte, wpe);
  ops::layernorm_forward(*s, ln, mean, rstd, emb.reshape({N, C}), lnw, lnb);
  ops::matmul_forward(*s, qkv.reshape({N, 3 * C}), ln, wqkv, bqkv);
  ops::attention_forward(*s, att_out, att, qkv);
  ops::matmul_forward(*s, h, att_out.reshape({N, C}), wfc, bfc);
  ops::gelu_forward(*s, g, h);
  ops::matmul_forward(*s, proj, g, wproj, bproj);
  ops::residual_forward(*s, res, emb.reshape({N, C}), proj);
  ops::matmul_forward(*s, logits, res, wte, Tensor{});
  ops::crossentropy_forward(*s, losses, lse, logits, targets, V);

  // The vocab-parallel loss over two slices of the vocabulary.
  Tensor stats = zeros({2, N, 3}), losses2 = zeros({N}), lse2 = zeros({N});
  for (int p = 0; p < 2; p++) {
    Tensor part = zeros({N, Vp / 2});
    ops::matmul_forward(*s, part, res, wte.view(p * (Vp / 2) * C, {Vp / 2, C}), Tensor{});
    ops::crossentropy_partial(*s, stats.view(p * N * 3, {N, 3}), part, targets, V,
                              {.begin = p * (Vp / 2), .total = V});
  }
  ops::crossentropy_combine(*s, losses2, lse2, stats);

  // A rank's slice of the vocabulary (ids 256..499 and padding), ids from
  // the whole vocabulary: embedding forward and backward, and the loss's
  // backward on the slice's logits (the last `part` computed).
  const Tensor ids = targets.reshape({B, T});
  const gpu::VocabSlice slice1{.begin = Vp / 2, .total = V};
  const Tensor wte1 = wte.view((Vp / 2) * C, {Vp / 2, C});
  Tensor emb1 = zeros({B, T, C}), dwte1 = zeros({Vp / 2, C}), dwpe1 = zeros({T, C});
  Tensor part1 = zeros({N, Vp / 2}), dpart1 = zeros({N, Vp / 2});
  ops::embedding_forward(*s, emb1, ids, wte1, wpe, slice1);
  ops::embedding_backward(*s, dwte1, dwpe1, emb1, ids, slice1);
  ops::matmul_forward(*s, part1, res, wte1, Tensor{});
  ops::crossentropy_backward(*s, dpart1, part1, lse, targets, 1.0f / N, V, slice1);

  // Backward.
  Tensor dlogits = zeros({N, Vp}), dres = zeros({N, C}), dwte = zeros({Vp, C});
  Tensor dg = zeros({N, 4 * C}), dwproj = zeros({C, 4 * C}), dbproj = zeros({C});
  Tensor dh = zeros({N, 4 * C}), datt_out = zeros({N, C}), dwfc = zeros({4 * C, C}),
         dbfc = zeros({4 * C});
  Tensor dqkv = zeros({B, T, 3 * C}), datt = zeros({B, NH, T, T});
  Tensor dln = zeros({N, C}), dwqkv = zeros({3 * C, C}), dbqkv = zeros({3 * C});
  Tensor demb = zeros({N, C}), dlnw = zeros({C}), dlnb = zeros({C}), dwpe = zeros({T, C});
  ops::crossentropy_backward(*s, dlogits, logits, lse, targets, 1.0f / N, V);
  ops::matmul_backward(*s, dres, dwte, Tensor{}, dlogits, res, wte, gpu::Accumulate::kNo);
  ops::matmul_backward(*s, dg, dwproj, dbproj, dres, g, wproj, gpu::Accumulate::kNo);
  ops::gelu_backward(*s, dh, h, dg);
  ops::matmul_backward(*s, datt_out, dwfc, dbfc, dh, att_out.reshape({N, C}), wfc,
                       gpu::Accumulate::kNo);
  ops::attention_backward(*s, dqkv, datt, datt_out.reshape({B, T, C}), qkv, att);
  ops::matmul_backward(*s, dln, dwqkv, dbqkv, dqkv.reshape({N, 3 * C}), ln, wqkv,
                       gpu::Accumulate::kNo);
  ops::layernorm_backward(*s, demb, dlnw, dlnb, dln, emb.reshape({N, C}), lnw, mean, rstd);
  ops::axpy(*s, demb, 1.0f, dres);  // the residual path
  ops::embedding_backward(*s, dwte, dwpe, demb.reshape({B, T, C}), tokens);

  // Norm and optimizer.
  Tensor norm = Tensor::empty(dev, gpu::DType::kF64, {1});
  ops::squared_norm(*s, norm, dwte);
  Tensor m = zeros({Vp, C}), v = zeros({Vp, C});
  gpu::AdamWArgs adam;
  adam.lr = 1e-3f;
  adam.weight_decay = 0.1f;
  adam.grad_scale = 0.5f;
  ops::adamw(*s, wte, dwte, m, v, adam);

  // Generation: the same qkv fed to the KV cache in two halves.
  Tensor kc = zeros({B, NH, T, C / NH}), vc = zeros({B, NH, T, C / NH});
  std::vector<Tensor> cached;
  for (int half = 0; half < 2; half++) {
    Tensor part = zeros({B, T / 2, 3 * C}), out = zeros({B, T / 2, C});
    Tensor catt = zeros({B, NH, T / 2, T});
    for (int b = 0; b < B; b++) {  // rows [half*T/2, (half+1)*T/2) of batch b
      ops::axpy(*s, part.view(b * (T / 2) * 3 * C, {T / 2, 3 * C}), 1.0f,
                qkv.view((b * T + half * (T / 2)) * 3 * C, {T / 2, 3 * C}));
    }
    ops::attention_cached(*s, out, catt, kc, vc, part, half * (T / 2));
    cached.push_back(out);
  }

  const absl::Status st = s->synchronize();
  EXPECT_TRUE(st.ok()) << dev.name() << ": " << st;
  auto host = [&](const Tensor& t) {
    Tensor hst = Tensor::empty(gpu::cpu_device(), t.dtype, t.shape);
    EXPECT_TRUE(dev.copy_to_host(t, hst.raw()).ok());
    if (t.dtype == gpu::DType::kF64) return Vec{*hst.data<double>()};
    return to_double(hst);
  };
  return {{"embedding_forward", host(emb)},
          {"layernorm_forward", host(ln)},
          {"layernorm rstd", host(rstd)},
          {"matmul_forward qkv", host(qkv)},
          {"attention_forward", host(att_out)},
          {"attention probabilities", host(att)},
          {"gelu_forward", host(g)},
          {"residual_forward", host(res)},
          {"crossentropy_forward", host(losses)},
          {"crossentropy_combine", host(losses2)},
          {"crossentropy_backward", host(dlogits)},
          {"matmul_backward dres", host(dres)},
          {"matmul_backward dwproj", host(dwproj)},
          {"matmul_backward dbproj", host(dbproj)},
          {"gelu_backward", host(dh)},
          {"attention_backward", host(dqkv)},
          {"matmul_backward dwqkv", host(dwqkv)},
          {"layernorm_backward dinp", host(demb)},
          {"layernorm_backward dw", host(dlnw)},
          {"layernorm_backward db", host(dlnb)},
          {"embedding_backward dwte", host(dwte)},
          {"embedding_backward dwpe", host(dwpe)},
          {"squared_norm", host(norm)},
          {"adamw p", host(wte)},
          {"adamw v", host(v)},
          {"attention_cached 1", host(cached[0])},
          {"attention_cached 2", host(cached[1])},
          {"embedding_forward on a slice", host(emb1)},
          {"embedding_backward on a slice dwte", host(dwte1)},
          {"embedding_backward on a slice dwpe", host(dwpe1)},
          {"crossentropy_backward on a slice", host(dpart1)}};
}

class CrossBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dev_ = backend(GetParam());
    if (dev_ == nullptr) GTEST_SKIP() << GetParam() << ": " << no_cuda_reason();
  }
  gpu::Device* dev_ = nullptr;
};

// Two runs of the whole step from the same inputs give the same bits: no op
// depends on scheduling (no float atomics, fixed reduction trees).
TEST_P(CrossBackendTest, EveryOpIsBitwiseRepeatable) {
  const std::vector<Output> a = run_block(*dev_), b = run_block(*dev_);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); i++) {
    EXPECT_TRUE(a[i].values == b[i].values) << dev_->name() << ": " << a[i].name << " differs";
  }
}

// The vocab-parallel loss equals the fused one, and the cached attention the
// causal one, on each backend (two ways through the same numbers).
TEST_P(CrossBackendTest, VocabParallelLossAndCachedAttentionAgree) {
  const std::vector<Output> out = run_block(*dev_);
  auto get = [&](const std::string& name) {
    for (const Output& o : out)
      if (o.name == name) return o.values;
    ADD_FAILURE() << "no output " << name;
    return Vec{};
  };
  EXPECT_LT(rel_error(get("crossentropy_combine"), get("crossentropy_forward")), 1e-6);
  Vec cached;
  const Vec c1 = get("attention_cached 1"), c2 = get("attention_cached 2");
  for (int b = 0; b < B; b++) {
    const std::size_t half = static_cast<std::size_t>(T / 2) * C;
    cached.insert(cached.end(), c1.begin() + b * half, c1.begin() + (b + 1) * half);
    cached.insert(cached.end(), c2.begin() + b * half, c2.begin() + (b + 1) * half);
  }
  EXPECT_LT(rel_error(cached, get("attention_forward")), 1e-6);
}

// A token id out of range fails the op; the stream's later ops do nothing
// (y keeps its zeros) and a host callback after them sees the error.
TEST_P(CrossBackendTest, AFaultInDataSkipsLaterOpsAndReachesCallbacks) {
  std::unique_ptr<gpu::Stream> s = dev_->make_stream({.threads = 2});
  auto on = [&](const Tensor& t) {
    Tensor d = Tensor::empty(*dev_, t.dtype, t.shape);
    EXPECT_TRUE(dev_->copy_from_host(t.raw(), d).ok());
    return d;
  };
  Tensor out = on(filled({1, 2, 4}, 0.0f)), y = on(filled({64}, 0.0f));
  ops::embedding_forward(*s, out, on(int_tensor({1, 9}, {1, 2})), on(filled({6, 4}, 1.0f)),
                         on(filled({2, 4}, 1.0f)));
  ops::fill(*s, y, 1.0f);
  std::atomic<bool> saw_error{false};
  gpu::Stream* raw = s.get();
  s->host_callback([&saw_error, raw] { saw_error = !raw->status().ok(); });
  const absl::Status st = s->synchronize();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message(), "embedding_forward: a token id is outside [0, 6)");
  EXPECT_TRUE(saw_error.load());
  Tensor hy = filled({64}, -1.0f);
  ASSERT_TRUE(dev_->copy_to_host(y, hy.raw()).ok());
  for (double v : to_double(hy)) ASSERT_EQ(v, 0.0) << "an op after the fault ran";
}

// Streams as gpu/device.h says: an event orders two streams; a callback runs
// after a failed op; an exception out of a callback fails its stream.
TEST_P(CrossBackendTest, StreamsKeepTheDeviceContract) {
  std::unique_ptr<gpu::Stream> a = dev_->make_stream({.threads = 2}),
                               b = dev_->make_stream({.threads = 2});
  const int n = 1 << 20;
  auto zeros = [&](int count) {
    Tensor t = Tensor::empty(*dev_, gpu::DType::kF32, {count});
    EXPECT_TRUE(dev_->copy_from_host(filled({count}, 0.0f).raw(), t).ok());
    return t;
  };
  Tensor x = zeros(n), y = zeros(n);
  std::unique_ptr<gpu::Event> e = dev_->make_event();
  ops::fill(*a, x, 1.0f);
  for (int i = 0; i < 8; i++) ops::axpy(*a, x, 1.0f, x);  // 256 once a is done
  a->record(*e);
  b->wait(*e);
  ops::axpy(*b, y, 1.0f, x);
  ASSERT_TRUE(b->synchronize().ok());
  Tensor hy = filled({n}, 0.0f);
  ASSERT_TRUE(dev_->copy_to_host(y, hy.raw()).ok());
  EXPECT_EQ(hy.data<float>()[0], 256.0f);
  EXPECT_EQ(hy.data<float>()[n - 1], 256.0f);

  std::atomic<bool> ran{false};
  ops::layernorm_forward(*a, y.view(0, {4, 8}), zeros(4), zeros(4), x.view(0, {4, 8}), zeros(7),
                         zeros(8));
  a->host_callback([&ran] { ran = true; });
  EXPECT_TRUE(absl::IsInvalidArgument(a->synchronize()));
  EXPECT_TRUE(ran.load());

  b->host_callback([] { throw std::runtime_error("boom"); });
  const absl::Status st = b->synchronize();
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st;
}

INSTANTIATE_TEST_SUITE_P(Backends, CrossBackendTest, ::testing::Values("cpu", "cuda"));

// CUDA against the CPU reference, op by op, within fp32 rounding (the op
// suite's tolerances: forwards to 1e-5 norm-wise, gradients, at the end of
// longer chains of sums in another order, to 1e-4; a wrong kernel is off by
// O(1)). Skips, saying why, where no GPU is present.
TEST(CudaVsCpu, EveryOpOfABlockStepMatchesTheCpuBackend) {
  gpu::Device* cuda = backend("cuda");
  if (cuda == nullptr) GTEST_SKIP() << "no GPU: " << no_cuda_reason();
  const std::vector<Output> want = run_block(gpu::cpu_device()), got = run_block(*cuda);
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); i++) {
    const bool grad = want[i].name.find("backward") != std::string::npos ||
                      want[i].name.find("adamw") != std::string::npos ||
                      want[i].name == "squared_norm";
    EXPECT_LT(rel_error(got[i].values, want[i].values), grad ? 1e-4 : 1e-5) << want[i].name;
  }
}

}  // namespace
}  // namespace troupe::testing
