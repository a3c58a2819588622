// Batch-size ramp-up and the sample-based learning rate, against Megatron's
// rules worked out by hand.
#include "model/batch_schedule.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/optimizer.h"
#include "model/trainer.h"

namespace troupe::model {
namespace {

// --rampup-batch-size 32 32 1000 to 128: (128 - 32) / 32 = 3 increments,
// one every 1000 / 3 = 333.3 samples. Batches of 32 while fewer than 333.3
// samples are consumed (0, 32, ..., 320: 11 steps, 352 consumed), 64 while
// fewer than 666.7 (352 ... 608: 5 steps, 672), 96 up to 1000 (672 ... 960:
// 4 steps, 1056), then 128. --train-samples 2000: the ramp's 20 steps and
// (2000 - 1056) / 128 = 7 more.
TEST(BatchSchedule, MegatronsRampUpByHand) {
  const RampUp r{.start = 32, .increment = 32, .samples = 1000};
  EXPECT_EQ(*steps_for_samples(r, 128, 2000), 27);
  const BatchSchedule b(r, 128, 27);
  std::vector<int> want;
  want.insert(want.end(), 11, 32);
  want.insert(want.end(), 5, 64);
  want.insert(want.end(), 4, 96);
  want.insert(want.end(), 7, 128);
  for (int step = 1; step <= 27; step++) {
    EXPECT_EQ(b.global_batch(step), want[static_cast<std::size_t>(step - 1)]) << "step " << step;
  }
  EXPECT_EQ(b.consumed_before(1), 0);
  EXPECT_EQ(b.consumed_before(12), 352);
  EXPECT_EQ(b.consumed_before(17), 672);
  EXPECT_EQ(b.consumed_before(21), 1056);
  EXPECT_EQ(b.consumed_before(28), 1056 + 7 * 128);
  // Without a ramp-up: N / GBS whole steps.
  EXPECT_EQ(*steps_for_samples({}, 128, 2000), 15);
  const BatchSchedule fixed({}, 128, 3);
  EXPECT_EQ(fixed.global_batch(2), 128);
  EXPECT_EQ(fixed.consumed_before(3), 256);
}

// MT-NLG's ramp (Smith et al. 2022: 32 to 1920 by 32 over the first 12B
// tokens, 12e9 / 2048 = 5,859,375 samples): 59 increments, one every
// 99,311.4 samples; 1888 just before the ramp's end, where it reaches 1920.
TEST(BatchSchedule, MtNlgsRampReachesTheFullBatch) {
  const RampUp r{.start = 32, .increment = 32, .samples = 5859375};
  EXPECT_EQ(rampup_batch(r, 1920, 0), 32);
  EXPECT_EQ(rampup_batch(r, 1920, 99311), 32);
  EXPECT_EQ(rampup_batch(r, 1920, 99312), 64);
  EXPECT_EQ(rampup_batch(r, 1920, 5859374), 1888);
  EXPECT_EQ(rampup_batch(r, 1920, 5859375), 1920);
  EXPECT_TRUE(check_rampup(r, 1920, 1 * 8).ok());
}

// Megatron's loops, step by step (update_num_microbatches over consumed
// samples; update_train_iters), against the schedule's segments, for ramps
// whose increments fall between samples in every way.
TEST(BatchSchedule, EqualsMegatronsStepByStepLoops) {
  struct Case {
    RampUp r;
    int gbs;
    std::int64_t train;
  };
  for (const Case& c :
       {Case{{1, 1, 10}, 4, 40}, Case{{2, 2, 7}, 10, 100}, Case{{3, 3, 1000}, 30, 5000},
        Case{{4, 4, 40}, 16, 30}, Case{{8, 8, 999}, 64, 999}, Case{{5, 5, 3}, 5, 50},
        Case{{6, 2, 123457}, 40, 700001}}) {
    SCOPED_TRACE(::testing::Message() << c.r.start << " " << c.r.increment << " " << c.r.samples
                                      << " to " << c.gbs << ", " << c.train << " samples");
    // update_train_iters.
    std::int64_t steps = 0, consumed = 0;
    while (consumed <= c.r.samples && consumed <= c.train) {
      consumed += rampup_batch(c.r, c.gbs, consumed);
      steps++;
    }
    if (c.train > consumed) steps += (c.train - consumed) / c.gbs;
    ASSERT_EQ(*steps_for_samples(c.r, c.gbs, c.train), steps);
    // Each step's batch at the samples consumed before it.
    const BatchSchedule b(c.r, c.gbs, static_cast<int>(steps));
    consumed = 0;
    for (int step = 1; step <= steps; step++) {
      const int batch = rampup_batch(c.r, c.gbs, consumed);
      ASSERT_EQ(b.consumed_before(step), consumed) << "step " << step;
      ASSERT_EQ(b.global_batch(step), batch) << "step " << step;
      consumed += batch;
    }
    EXPECT_EQ(b.consumed_before(static_cast<int>(steps) + 1), consumed);
  }
}

// A billion steps cost a few segments, not memory per step; a run longer
// than the step counter allows is refused.
TEST(BatchSchedule, LongRunsAreCheapAndTooLongOnesRefused) {
  const RampUp r{.start = 32, .increment = 32, .samples = 5859375};
  const BatchSchedule b(r, 1920, static_cast<int>(kMaxSteps));
  EXPECT_EQ(b.global_batch(static_cast<int>(kMaxSteps)), 1920);
  EXPECT_EQ(b.global_batch(1), 32);
  EXPECT_EQ(steps_for_samples({}, 1, std::int64_t{1} << 40).status().message(),
            "--train-samples 1099511627776: more than 1073741823 steps; raise "
            "--global-batch-size or train fewer samples");
  // Megatron's loop would take 10^12 steps here: refused at once.
  EXPECT_FALSE(
      steps_for_samples({.start = 1, .increment = 1, .samples = 1000000000000}, 2, 1000000000000)
          .ok());
}

TEST(BatchSchedule, BadRampsAreClearErrors) {
  EXPECT_EQ(check_rampup({.start = 4, .increment = 4, .samples = 0}, 16, 4).message(),
            "--rampup-batch-size 4 4 0: expected START, INCREMENT and SAMPLES all positive");
  EXPECT_EQ(check_rampup({.start = 6, .increment = 4, .samples = 100}, 31, 2).message(),
            "--rampup-batch-size 6 4 100: --global-batch-size 31 minus START is not a multiple "
            "of INCREMENT");
  EXPECT_EQ(check_rampup({.start = 6, .increment = 6, .samples = 100}, 30, 4).message(),
            "--rampup-batch-size 6 6 100: START and INCREMENT must be multiples of "
            "--micro-batch-size x data-parallel size = 4");
  EXPECT_EQ(check_rampup({.start = 64, .increment = 32, .samples = 100}, 32, 4).message(),
            "--rampup-batch-size 64 32 100: START is more than --global-batch-size 32");
}

// Megatron's sample-based schedule: warm-up to the peak over the warm-up
// samples, then cosine to min_lr at the decay samples; the rate of a step
// is the one at the samples consumed before it.
TEST(BatchSchedule, LearningRateBySamples) {
  const LrSchedule s{.lr = 1.0f, .min_lr = 0.1f, .warmup_samples = 100, .decay_samples = 300};
  EXPECT_FLOAT_EQ(lr_at_samples(s, 0), 0.0f);
  EXPECT_FLOAT_EQ(lr_at_samples(s, 25), 0.25f);
  EXPECT_FLOAT_EQ(lr_at_samples(s, 100), 1.0f);
  EXPECT_FLOAT_EQ(lr_at_samples(s, 200), 0.55f);  // halfway: min + (max - min) / 2
  EXPECT_FLOAT_EQ(lr_at_samples(s, 301), 0.1f);
  TrainOptions o;
  o.global_batch = 32;
  o.train_samples = 1000;
  o.lr = s;
  const BatchSchedule b(RampUp{.start = 8, .increment = 8, .samples = 200}, 32, 10);
  EXPECT_FLOAT_EQ(o.lr_of_step(b, 4), lr_at_samples(s, 24));  // 3 steps of 8 before it
}

}  // namespace
}  // namespace troupe::model
