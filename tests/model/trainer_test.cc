// The single-rank training loop: learning, determinism, gradient
// accumulation, vocabulary padding, LR schedule and clipping.
#include "model/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/data/indexed_dataset.h"
#include "model/data/synthetic.h"
#include "model/optimizer.h"
#include "tests/tiny_model.h"

namespace troupe::model {
namespace {

TrainOptions trainer_tiny(int steps) {
  return fixtures::tiny(
      {.micro_batch = 4, .global_batch = 4, .steps = steps, .decay_iters = steps, .threads = 2});
}

std::vector<StepMetrics> run(const TrainOptions& o) {
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  std::vector<StepMetrics> out;
  for (int i = 0; i < o.steps; i++) {
    StepMetrics m;
    absl::Status st = (*t)->step(&m);
    EXPECT_TRUE(st.ok()) << st;
    out.push_back(m);
  }
  return out;
}

// `troupe train --model tiny --steps 50` with its defaults learns the
// synthetic phrases: the loss falls well below log V.
TEST(Trainer, LossFallsOnTheSyntheticCorpus) {
  auto m = run(trainer_tiny(50));
  double first = 0, last = 0;
  for (int i = 0; i < 5; i++) {
    first += m[i].loss / 5;
    last += m[45 + i].loss / 5;
  }
  // At initialisation a logit is h . w_v with h the final LayerNorm's output
  // (unit variance) and w_v ~ N(0, 0.02^2): z ~ N(0, C * 0.02^2), so the
  // expected cross-entropy is log V + C * 0.02^2 / 2 = 6.2511 for tiny (C = 64,
  // V = 512); 256 tokens of one batch scatter it by about 0.02.
  const double want0 = std::log(512.0) + 64 * 0.02 * 0.02 / 2;
  EXPECT_NEAR(m[0].loss, want0, 0.03);
  EXPECT_LT(last, first - 0.3) << "first " << first << " last " << last;
}

TEST(Trainer, TwoRunsAreBitwiseIdentical) {
  auto a = run(trainer_tiny(4)), b = run(trainer_tiny(4));
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(std::memcmp(&a[i].loss, &b[i].loss, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&a[i].grad_norm, &b[i].grad_norm, sizeof(double)), 0);
  }
}

TEST(Trainer, GradientAccumulationEqualsOneBigBatch) {
  TrainOptions big = trainer_tiny(3), accum = trainer_tiny(3);
  big.micro_batch = big.global_batch = 8;
  accum.micro_batch = 2;
  accum.global_batch = 8;
  auto a = run(big), b = run(accum);
  for (int i = 0; i < 3; i++) {
    EXPECT_NEAR(a[i].loss, b[i].loss, 1e-6 * a[i].loss) << i;
    EXPECT_NEAR(a[i].grad_norm, b[i].grad_norm, 1e-5 * a[i].grad_norm) << i;
  }
}

TEST(Trainer, VocabularyPaddingDoesNotChangeResults) {
  TrainOptions unpadded = trainer_tiny(3), padded = trainer_tiny(3);
  unpadded.model.V = padded.model.V = 500;
  unpadded.model.vocab_multiple = 1;  // Vp = 500
  padded.model.vocab_multiple = 128;  // Vp = 512
  auto a = run(unpadded), b = run(padded);
  for (int i = 0; i < 3; i++) {
    EXPECT_NEAR(a[i].loss, b[i].loss, 1e-6 * a[i].loss) << i;
    EXPECT_NEAR(a[i].grad_norm, b[i].grad_norm, 1e-5 * a[i].grad_norm) << i;
  }
}

TEST(Trainer, BadOptionsNameTheFlag) {
  TrainOptions o = trainer_tiny(1);
  o.global_batch = 6;
  o.micro_batch = 4;
  EXPECT_EQ(Trainer::create(o).status().message(),
            "--global-batch-size 6 must be a positive multiple of --micro-batch-size 4");
  o = trainer_tiny(1);
  o.data_path = {"/nonexistent/corpus"};
  EXPECT_TRUE(absl::IsNotFound(Trainer::create(o).status()));
}

// The mean cross-entropy of `gpt`'s parameters over validation samples
// [first, first + n), computed apart from the trainer: a model of one
// sequence per forward (the trainer runs B = 4), the samples read straight
// from the source, the tokens' losses summed here.
double mean_loss_over(const Gpt& gpt, const data::SampleSource& source, std::int64_t first,
                      std::int64_t n) {
  const GptConfig& c = gpt.config();
  Gpt one(c, 1, gpu::cpu_device());
  std::memcpy(one.params().raw(), gpt.params().raw(), gpt.params().nbytes());
  auto s = gpu::cpu_device().make_stream({.threads = 1});
  std::vector<std::int32_t> sample(static_cast<std::size_t>(c.T) + 1);
  gpu::Tensor tokens = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kI32, {1, c.T});
  gpu::Tensor targets = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kI32, {1, c.T});
  double sum = 0.0;
  for (std::int64_t i = first; i < first + n; i++) {
    EXPECT_TRUE(source.sample(i, sample).ok());
    std::memcpy(tokens.raw(), sample.data(), tokens.nbytes());
    std::memcpy(targets.raw(), sample.data() + 1, targets.nbytes());
    one.forward(*s, tokens, targets);
    EXPECT_TRUE(s->synchronize().ok());
    for (int t = 0; t < c.T; t++) sum += one.acts().losses.data<float>()[t];
  }
  return sum / static_cast<double>(n * c.T);
}

// Training on a blend of two Megatron datasets, with validation loss on the
// steps that are multiples of --eval-interval and only there: evaluation e
// is the mean loss over validation samples [e*K*GBS, (e+1)*K*GBS) with the
// parameters of that step, and does not change the training.
TEST(Trainer, BlendWithValidation) {
  const std::string dir = ::testing::TempDir();
  for (int k = 0; k < 2; k++) {
    data::PhraseCorpusOptions c{.vocab_size = 512, .num_tokens = 20000, .seed = 10u + k};
    ASSERT_TRUE(data::write_indexed_dataset(dir + "/blend_" + std::to_string(k),
                                            data::phrase_corpus(c), data::TokenDType::kU16)
                    .ok());
  }
  TrainOptions o = trainer_tiny(4);
  o.data_path = {"0.25", dir + "/blend_0", "0.75", dir + "/blend_1"};
  o.split = "90,10,0";
  o.data_cache_path = dir + "/blend_cache";
  o.eval_interval = 2;
  o.eval_iters = 3;
  auto t = Trainer::create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE((*t)->valid_data(), nullptr);
  const std::int64_t per_eval = 3 * 4;  // K * GBS samples
  std::vector<StepMetrics> m(4);
  for (int i = 0; i < 4; i++) {
    ASSERT_TRUE((*t)->step(&m[static_cast<std::size_t>(i)]).ok());
    if (i % 2 == 1) {
      ASSERT_TRUE(m[static_cast<std::size_t>(i)].val_loss.has_value()) << "step " << i + 1;
      const double want =
          mean_loss_over((*t)->gpt(), *(*t)->valid_data(), (i / 2) * per_eval, per_eval);
      EXPECT_NEAR(*m[static_cast<std::size_t>(i)].val_loss, want, 1e-5 * want) << "step " << i + 1;
    } else {
      EXPECT_FALSE(m[static_cast<std::size_t>(i)].val_loss.has_value()) << "step " << i + 1;
    }
  }
  // The two evaluations read different samples (and the model moved).
  EXPECT_NE(*m[1].val_loss, *m[3].val_loss);
  // Without evaluation, the same training losses, bit for bit.
  TrainOptions no_eval = o;
  no_eval.eval_interval = 0;
  auto plain = run(no_eval);
  for (int i = 0; i < 4; i++) EXPECT_EQ(plain[i].loss, m[static_cast<std::size_t>(i)].loss) << i;
  // Same options, same numbers (indices now from the cache).
  auto again = run(o);
  EXPECT_EQ(again[3].loss, m[3].loss);
  EXPECT_EQ(*again[3].val_loss, *m[3].val_loss);
}

TEST(LrSchedule, WarmupThenCosineToMinimum) {
  LrSchedule s{.lr = 1.0f, .min_lr = 0.1f, .warmup_iters = 10, .decay_iters = 110};
  EXPECT_FLOAT_EQ(lr_at(s, 1), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(s, 10), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 60), 0.55f);  // halfway: min + (max - min) / 2
  EXPECT_FLOAT_EQ(lr_at(s, 110), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(s, 500), 0.1f);
  LrSchedule constant{.lr = 0.5f};
  EXPECT_FLOAT_EQ(lr_at(constant, 1000), 0.5f);
}

// The rate each step uses, from Megatron's OptimizerParamScheduler by hand:
// its num_steps counts the updates already made (step(0) at construction,
// step(1) after each update), so update k uses num_steps = k - 1. Warm-up 2,
// decay over 4 steps to 0.1 of lr 1: num_steps 0, 1, 2 warm up (0, 0.5, 1),
// then cosine with ratio (3 - 2) / (4 - 2) = 0.5: 0.1 + 0.9 * 0.5 = 0.55.
TEST(LrSchedule, EachStepUsesMegatronsRateForTheUpdatesBeforeIt) {
  TrainOptions o = trainer_tiny(4);
  o.lr = {.lr = 1.0f, .min_lr = 0.1f, .warmup_iters = 2, .decay_iters = 4};
  auto m = run(o);
  const float want[] = {0.0f, 0.5f, 1.0f, 0.55f};
  for (int k = 0; k < 4; k++) EXPECT_FLOAT_EQ(m[static_cast<std::size_t>(k)].lr, want[k]) << k;
  // A one-step run that decays over its one step trains at the full rate
  // (it once used min_lr, 0, and did nothing).
  TrainOptions one = trainer_tiny(1);
  one.lr.min_lr = 0.0f;
  EXPECT_FLOAT_EQ(run(one)[0].lr, one.lr.lr);
}

TEST(Clip, FactorAsMegatronAndPyTorch) {
  EXPECT_FLOAT_EQ(clip_factor(0.5, 1.0f), 1.0f);
  EXPECT_NEAR(clip_factor(4.0, 1.0f), 0.25f, 1e-6);
  EXPECT_FLOAT_EQ(clip_factor(100.0, 0.0f), 1.0f);  // disabled
}

}  // namespace
}  // namespace troupe::model
