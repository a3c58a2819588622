// A GPT split into pipeline stages, run one stage after another, equals the
// whole model: bitwise the same loss and gradients, since every stage runs
// the same ops — except the tied embedding, whose two halves (first stage's
// lookup, last stage's LM head) are summed in another order than the whole
// model accumulates them: equal to float rounding.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "gpu/ops.h"
#include "model/gpt.h"
#include "tests/test_util.h"

namespace troupe::model {
namespace {

class StageTest : public ::testing::TestWithParam<int> {};

TEST_P(StageTest, StagesInSequenceEqualTheWholeModel) {
  const int pp = GetParam(), B = 2;
  GptConfig c = *preset("tiny");
  c.V = 500;  // padded inside: the split must not care
  auto s = gpu::cpu_device().make_stream({.threads = 2});
  std::mt19937 rng(5);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(B * c.T)), tgt(tok.size());
  for (auto& t : tok) t = static_cast<std::int32_t>(rng() % 500);
  for (auto& t : tgt) t = static_cast<std::int32_t>(rng() % 500);
  gpu::Tensor tokens = testing::int_tensor(tok, {B, c.T}),
              targets = testing::int_tensor(tgt, {B, c.T});
  const float dloss = 1.0f / static_cast<float>(B * c.T);

  Gpt whole(c, B, gpu::cpu_device());
  ASSERT_TRUE(whole.init(11).ok());
  whole.zero_grad(*s);
  whole.forward(*s, tokens, targets);
  whole.backward(*s, tokens, targets, dloss);

  std::vector<std::unique_ptr<Gpt>> stages;
  for (int k = 0; k < pp; k++) {
    stages.push_back(std::make_unique<Gpt>(c, B, gpu::cpu_device(), StageSpec::pipeline(c, pp, k)));
    ASSERT_TRUE(stages.back()->init(11).ok());
    stages.back()->zero_grad(*s);
  }
  for (int k = 0; k < pp; k++) {
    stages[static_cast<std::size_t>(k)]->forward(
        *s, tokens, targets,
        k == 0 ? gpu::Tensor{} : stages[static_cast<std::size_t>(k - 1)]->output());
  }
  for (int k = pp - 1; k >= 0; k--) {
    stages[static_cast<std::size_t>(k)]->backward(
        *s, tokens, targets, dloss,
        k == pp - 1 ? gpu::Tensor{} : stages[static_cast<std::size_t>(k + 1)]->input_grad());
  }
  ASSERT_TRUE(s->synchronize().ok());

  const gpu::Tensor& la = whole.acts().losses;
  const gpu::Tensor& lb = stages.back()->acts().losses;
  EXPECT_EQ(std::memcmp(la.raw(), lb.raw(), la.nbytes()), 0) << "losses differ";
  // Every parameter's gradient, by name; wte from the first and last stage.
  int compared = 0;
  for (const ParamSpec& spec : whole.layout().specs()) {
    SCOPED_TRACE(spec.name);
    const gpu::Tensor want = whole.layout().view(whole.grads(), spec);
    std::vector<float> got(static_cast<std::size_t>(spec.numel()), 0.0f);
    for (auto& st : stages) {
      const ParamSpec* mine = st->layout().find_or_null(spec.name);
      if (mine == nullptr) continue;
      const float* g = st->layout().view(st->grads(), *mine).data<float>();
      for (std::size_t i = 0; i < got.size(); i++) got[i] += g[i];
    }
    if (spec.name == "wte.weight" && pp > 1) {
      std::vector<double> g(got.begin(), got.end());
      EXPECT_LT(testing::rel_error(g, testing::to_double(want)), 1e-6);
    } else {
      ASSERT_EQ(std::memcmp(got.data(), want.raw(), want.nbytes()), 0);
    }
    compared++;
  }
  EXPECT_EQ(compared, static_cast<int>(whole.layout().specs().size()));
  if (pp > 1) {
    EXPECT_EQ(stages[0]->layout().find_or_null("ln_f.weight"), nullptr);
    EXPECT_EQ(stages.back()->layout().find_or_null("wpe.weight"), nullptr);
    EXPECT_NE(stages.back()->layout().find_or_null("wte.weight"), nullptr);  // the tied head
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, StageTest, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace troupe::model

namespace troupe::model {
namespace {

// With two activation slots a stage can run F(0) F(1) B(0) B(1), as 1F1B's
// warm-up does; the gradients are bitwise those of F(0) B(0) F(1) B(1).
TEST(StageSlots, TwoMicroBatchesInFlightEqualOneAtATime) {
  const int B = 2;
  GptConfig c = *preset("tiny");
  auto s = gpu::cpu_device().make_stream({.threads = 2});
  std::mt19937 rng(9);
  std::vector<gpu::Tensor> tokens, targets;
  for (int mb = 0; mb < 2; mb++) {
    std::vector<std::int32_t> tk(static_cast<std::size_t>(B * c.T)), tg(tk.size());
    for (auto& t : tk) t = static_cast<std::int32_t>(rng() % 512);
    for (auto& t : tg) t = static_cast<std::int32_t>(rng() % 512);
    tokens.push_back(testing::int_tensor(tk, {B, c.T}));
    targets.push_back(testing::int_tensor(tg, {B, c.T}));
  }
  const float dloss = 1.0f / static_cast<float>(2 * B * c.T);
  Gpt serial(c, B, gpu::cpu_device(), StageSpec::whole(c), 1);
  Gpt inflight(c, B, gpu::cpu_device(), StageSpec::whole(c), 2);
  ASSERT_TRUE(serial.init(3).ok());
  ASSERT_TRUE(inflight.init(3).ok());
  serial.zero_grad(*s);
  inflight.zero_grad(*s);
  for (int mb = 0; mb < 2; mb++) {
    serial.forward(*s, tokens[mb], targets[mb]);
    serial.backward(*s, tokens[mb], targets[mb], dloss);
  }
  inflight.forward(*s, tokens[0], targets[0], gpu::Tensor{}, 0);
  inflight.forward(*s, tokens[1], targets[1], gpu::Tensor{}, 1);
  inflight.backward(*s, tokens[0], targets[0], dloss, gpu::Tensor{}, 0);
  inflight.backward(*s, tokens[1], targets[1], dloss, gpu::Tensor{}, 1);
  ASSERT_TRUE(s->synchronize().ok());
  EXPECT_EQ(inflight.slots(), 2);
  EXPECT_EQ(std::memcmp(serial.grads().raw(), inflight.grads().raw(), serial.grads().nbytes()), 0);
}

}  // namespace
}  // namespace troupe::model
