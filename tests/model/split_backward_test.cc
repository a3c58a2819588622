// The backward in two halves (Gpt::backward_input, then backward_weight)
// adds bitwise what the whole backward adds, with other micro-batches' ops
// between B and W and the slot reused after B: for the whole model and a
// pipeline's first and last stage, every recompute mode, fp32 and bf16.
// A stash holds what counted_stash_bytes says, counted by hand.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/host_values.h"
#include "gpu/ops.h"
#include "model/gpt.h"
#include "tests/test_util.h"

namespace troupe::model {
namespace {

struct Passes {
  std::vector<float> grads;
  std::vector<std::vector<char>> input_grads;  // per micro-batch
  std::vector<GradPoint> points;
};

// Three micro-batches through one stage with two slots: F0 F1 B0 F2 B1 B2,
// the backwards whole or split (W0 after B1, W1 and W2 at the end).
Passes run(const GptConfig& c, const StageSpec& spec, const ActivationOptions& o, bool split) {
  const int B = 2, M = 3;
  auto s = gpu::cpu_device().make_stream({.threads = 2});
  std::mt19937 rng(7);
  auto ints = [&] {
    std::vector<std::int32_t> v(static_cast<std::size_t>(B * c.T));
    for (auto& t : v) t = static_cast<std::int32_t>(rng() % static_cast<unsigned>(c.V));
    return testing::int_tensor(v, {B, c.T});
  };
  Gpt g(c, B, gpu::cpu_device(), spec, /*slots=*/2, {}, o, /*stashes=*/split ? 2 : 0);
  EXPECT_TRUE(g.init(3).ok());
  const gpu::DType A = g.dtype();
  auto randn = [&](float scale) {
    std::vector<float> v(static_cast<std::size_t>(B * c.T * c.C));
    std::normal_distribution<float> d(0.0f, scale);
    for (float& x : v) x = d(rng);
    gpu::Tensor t = gpu::Tensor::empty(gpu::cpu_device(), A, {B, c.T, c.C});
    EXPECT_TRUE(gpu::copy_values_to_device(v, t).ok());
    return t;
  };
  std::vector<gpu::Tensor> tokens, targets, inputs, douts;
  for (int j = 0; j < M; j++) {
    tokens.push_back(ints());
    targets.push_back(ints());
    inputs.push_back(randn(1.0f));
    douts.push_back(randn(1e-3f));
  }
  Passes r;
  const float dloss = 1.0f / static_cast<float>(M * B * c.T);
  auto progress = [&](GradPoint p) { r.points.push_back(p); };
  r.input_grads.resize(M);
  auto fwd = [&](int j, int slot) {
    g.forward(*s, tokens[j], targets[j], spec.embedding ? gpu::Tensor{} : inputs[j], slot);
  };
  auto bwd = [&](int j, int slot) {
    const gpu::Tensor dout = spec.head ? gpu::Tensor{} : douts[j];
    if (split) {
      g.backward_input(*s, tokens[j], targets[j], dloss, dout, slot, /*stash=*/j % 2);
    } else {
      g.backward(*s, tokens[j], targets[j], dloss, dout, slot, progress);
    }
    EXPECT_TRUE(s->synchronize().ok());
    const gpu::Tensor& ig = g.input_grad(slot);
    const char* bytes = static_cast<const char*>(ig.raw());
    r.input_grads[j].assign(bytes, bytes + ig.nbytes());
  };
  auto w = [&](int j) {
    if (split) g.backward_weight(*s, j % 2, progress);
  };
  g.zero_grad(*s);
  fwd(0, 0);
  fwd(1, 1);
  bwd(0, 0);
  fwd(2, 0);  // the slot is free after B
  bwd(1, 1);
  w(0);
  bwd(2, 0);  // into stash 0 again, after W0
  w(1);
  w(2);
  EXPECT_TRUE(s->synchronize().ok());
  r.grads.assign(g.grads().data<float>(), g.grads().data<float>() + g.grads().numel());
  return r;
}

TEST(SplitBackward, BThenWIsBitwiseTheWholeBackward) {
  GptConfig c = *preset("tiny");
  c.L = 4;
  using enum Recompute;
  const std::vector<ActivationOptions> modes = {
      {},
      {.recompute = kSelective, .attention = AttentionKernel::kReference},
      {.recompute = kFull, .method = RecomputeMethod::kUniform, .recompute_layers = 2},
      {.recompute = kFull, .method = RecomputeMethod::kBlock, .recompute_layers = 1},
      {.precision = gpu::Precision::kBf16},
  };
  for (const ActivationOptions& o : modes) {
    for (int k : {-1, 0, 1}) {  // whole; stage 0 and 1 of 2
      const StageSpec spec = k < 0 ? StageSpec::whole(c) : StageSpec::pipeline(c, 2, k);
      SCOPED_TRACE(absl::StrCat(o.describe(), k < 0 ? " whole" : absl::StrCat(" stage ", k)));
      const Passes want = run(c, spec, o, false);
      const Passes got = run(c, spec, o, true);
      ASSERT_EQ(got.grads.size(), want.grads.size());
      EXPECT_EQ(std::memcmp(got.grads.data(), want.grads.data(), want.grads.size() * 4), 0);
      EXPECT_TRUE(got.input_grads == want.input_grads);
      EXPECT_TRUE(got.points == want.points);
      EXPECT_EQ(got.points.size(), want.points.size());
      EXPECT_GT(want.points.size(), 0u);
    }
  }
}

TEST(SplitBackward, TheStashHoldsWhatItCounts) {
  GptConfig c = *preset("tiny");
  const int B = 2;
  const StageSpec spec = StageSpec::whole(c);
  Gpt g(c, B, gpu::cpu_device(), spec, 1, {}, {}, /*stashes=*/1);
  ASSERT_TRUE(g.init(1).ok());
  // By hand: per layer the 8 operands of its 4 weight GEMMs, 16C wide
  // together; fp32, every tensor a multiple of 64 bytes here.
  const std::int64_t want = 4 * B * c.T * c.L * 16 * c.C;
  EXPECT_EQ(counted_stash_bytes(c, spec, B, 1), want);
  EXPECT_EQ(g.stash_bytes(), want);
}

}  // namespace
}  // namespace troupe::model
