// Activation recompute: every mode trains bitwise as the run that keeps
// everything (the recompute runs the same kernels on the same stream), and
// each mode's activations are what it says it keeps, by hand.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/trainer.h"
#include "tests/tiny_model.h"

namespace troupe::model {
namespace {

// 6 layers: uniform groups of 4 leave a shorter last group of 2.
TrainOptions recompute_tiny6(const ActivationOptions& a) {
  return fixtures::tiny({.layers = 6,
                         .micro_batch = 2,
                         .global_batch = 4,
                         .steps = 3,
                         .warmup_iters = 1,
                         .activations = a});
}

struct Trained {
  std::vector<StepMetrics> metrics;
  std::vector<float> params;
};

Trained train(const ActivationOptions& a) {
  Trained r;
  const TrainOptions o = recompute_tiny6(a);
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return r;
  for (int i = 0; i < o.steps; i++) {
    StepMetrics m;
    absl::Status st = (*t)->step(&m);
    EXPECT_TRUE(st.ok()) << st;
    r.metrics.push_back(m);
  }
  const gpu::Tensor& p = (*t)->gpt().params();
  r.params.assign(p.data<float>(), p.data<float>() + p.numel());
  return r;
}

std::vector<ActivationOptions> every_mode() {
  using enum Recompute;
  using enum RecomputeMethod;
  return {{.recompute = kSelective},
          {.recompute = kFull, .method = kUniform, .recompute_layers = 1},
          {.recompute = kFull, .method = kUniform, .recompute_layers = 4},
          {.recompute = kFull, .method = kUniform, .recompute_layers = 9},
          {.recompute = kFull, .method = kBlock, .recompute_layers = 2},
          {.recompute = kFull, .method = kBlock, .recompute_layers = 6}};
}

// With the reference attention kernel too: its selective recompute is the
// one that recomputes (the scores).
TEST(Recompute, EveryModeIsBitwiseTheRunWithout) {
  const Trained want = train({});
  std::vector<ActivationOptions> modes = every_mode();
  modes.push_back({.recompute = Recompute::kSelective, .attention = AttentionKernel::kReference});
  for (const ActivationOptions& a : modes) {
    if (a.attention == AttentionKernel::kReference) {
      const Trained ref = train({.attention = AttentionKernel::kReference});
      const Trained got = train(a);
      ASSERT_EQ(got.params.size(), ref.params.size());
      ASSERT_EQ(got.metrics.size(), ref.metrics.size());
      for (std::size_t i = 0; i < ref.metrics.size(); i++) {
        EXPECT_EQ(std::memcmp(&got.metrics[i].loss, &ref.metrics[i].loss, sizeof(double)), 0);
      }
      EXPECT_EQ(std::memcmp(got.params.data(), ref.params.data(), ref.params.size() * 4), 0);
      continue;
    }
    SCOPED_TRACE(a.describe());
    const Trained got = train(a);
    ASSERT_EQ(got.metrics.size(), want.metrics.size());
    for (std::size_t i = 0; i < want.metrics.size(); i++) {
      EXPECT_EQ(std::memcmp(&got.metrics[i].loss, &want.metrics[i].loss, sizeof(double)), 0)
          << "step " << i + 1 << ": " << got.metrics[i].loss << " vs " << want.metrics[i].loss;
      EXPECT_EQ(std::memcmp(&got.metrics[i].grad_norm, &want.metrics[i].grad_norm, sizeof(double)),
                0)
          << "step " << i + 1;
    }
    ASSERT_EQ(got.params.size(), want.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4), 0);
  }
}

// What one micro-batch keeps, from the device's byte count, against the
// tensors each mode keeps worked out by hand (in floats; every size here is
// a multiple of the 16-float rounding). Per layer and token, no recompute
// keeps ln1, residual2, ln2 and residual3 (4C), qkv (3C), atty (C), fch and
// its GELU (8C), the two LayerNorms' mean and rstd (4), and with the
// reference attention kernel the scores, NH*T (flash: each head's
// log-sum-exp, NH); selective drops the reference's scores and keeps
// everything with flash; full uniform keeps one C a group, full block one C
// for each of its first N layers.
TEST(Recompute, EachModeKeepsWhatItSays) {
  for (const AttentionKernel kernel : {AttentionKernel::kReference, AttentionKernel::kFlash}) {
    for (const char* name : {"cpu-small", "gpt2-124m"}) {
      SCOPED_TRACE(absl::StrCat(name, " ", attention_kernel_name(kernel)));
      GptConfig c = *preset(name);
      const std::int64_t B = 2, T = c.T, C = c.C, NH = c.NH, L = c.L;
      const bool flash = kernel == AttentionKernel::kFlash;
      const std::int64_t scores = flash ? NH : NH * T;
      const std::int64_t layer = B * T * (16 * C + 4 + scores);
      auto measure = [&](ActivationOptions a) {
        a.attention = kernel;
        Gpt g(c, static_cast<int>(B), gpu::cpu_device(), StageSpec::whole(c), 1, {}, a);
        return std::pair<std::int64_t, std::int64_t>(g.activation_bytes_per_slot() / 4,
                                                     g.recompute_workspace_bytes() / 4);
      };
      using enum Recompute;
      using enum RecomputeMethod;
      const auto [none, none_work] = measure({});
      EXPECT_EQ(none_work, 0);
      // Besides the layers: the embedding's output, the final LayerNorm and
      // the running gradient (3C), its mean and rstd, lse and the losses (4),
      // and the logits (Vp).
      EXPECT_EQ(none, L * layer + B * T * (3 * C + 4 + c.Vp()));
      const auto [sel, sel_work] = measure({.recompute = kSelective});
      if (flash) {
        EXPECT_EQ(sel, none);  // nothing to recompute
        EXPECT_EQ(sel_work, 0);
      } else {
        EXPECT_EQ(none - sel, L * B * T * scores);
        EXPECT_EQ(sel_work, B * T * scores + B * T * C);  // one layer's scores and output
      }
      const auto [full1, full1_work] = measure({.recompute = kFull});
      EXPECT_EQ(none - full1, L * (layer - B * T * C));
      EXPECT_EQ(full1_work, layer);
      const auto [full4, full4_work] = measure({.recompute = kFull, .recompute_layers = 4});
      EXPECT_EQ(none - full4, L * layer - (L + 3) / 4 * B * T * C);
      EXPECT_EQ(full4_work, std::min<std::int64_t>(4, L) * layer);
      const auto [block2, block2_work] =
          measure({.recompute = kFull, .method = kBlock, .recompute_layers = 2});
      EXPECT_EQ(none - block2, 2 * (layer - B * T * C));
      EXPECT_EQ(block2_work, layer);
    }
  }
}

TEST(Recompute, BadOptionsAreClearErrors) {
  ActivationOptions a{.recompute = Recompute::kFull, .recompute_layers = 0};
  EXPECT_EQ(a.validate().message(), "--recompute-num-layers must be at least 1, is 0");
  EXPECT_FALSE(Trainer::create(recompute_tiny6(a)).ok());
  EXPECT_EQ(parse_recompute_granularity("most").status().message(),
            "--recompute-granularity 'most': use full or selective (none: off)");
  EXPECT_EQ(parse_recompute_method("random").status().message(),
            "--recompute-method 'random': use uniform or block");
}

}  // namespace
}  // namespace troupe::model
