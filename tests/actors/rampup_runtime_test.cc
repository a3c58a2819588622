// Batch-size ramp-up in the actors' runtime: every layout runs the single
// rank's ramped steps (its global batches, its data order, its learning
// rate by samples) within 1e-5, and a ramped run sees the learning rate a
// fixed-batch run sees at the same sample.
#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "actors/runtime/in_process.h"
#include "tests/tiny_model.h"

namespace troupe::actors {
namespace {

// 4 to 16 by 4 over the first 40 samples (an increment every 13.3), 120
// samples in all: batches of 4 (at 0, 4, 8, 12 consumed), 8 (16, 24), 12
// (32), then 16 from 44: the ramp's 7 steps and (120 - 44) / 16 = 4 more.
model::TrainOptions ramped() {
  model::TrainOptions o = fixtures::tiny({.layers = 4, .micro_batch = 2, .global_batch = 16});
  o.train_samples = 120;
  o.rampup = {.start = 4, .increment = 4, .samples = 40};
  o.steps = *model::steps_for_samples(o.rampup, o.global_batch, o.train_samples);
  o.lr.warmup_samples = 24;
  o.lr.decay_samples = 120;
  return o;
}

std::vector<model::StepMetrics> single(const model::TrainOptions& o) {
  std::vector<model::StepMetrics> out;
  auto t = model::Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int i = 0; t.ok() && i < o.steps; i++) {
    model::StepMetrics m;
    EXPECT_TRUE((*t)->step(&m).ok());
    out.push_back(m);
  }
  return out;
}

TEST(RampUpRuntime, EveryLayoutRunsTheSingleRanksRampedSteps) {
  const model::TrainOptions o = ramped();
  ASSERT_EQ(o.steps, 11);
  const std::vector<model::StepMetrics> want = single(o);
  const std::vector<int> batches = {4, 4, 4, 4, 8, 8, 12, 16, 16, 16, 16};
  for (std::size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(want[i].global_batch, batches[i]) << "step " << i + 1;
  }
  EXPECT_EQ(want.back().consumed_samples, 108);
  struct Case {
    ParallelOptions par;
    bool sequence_parallel = false;
  };
  for (const Case& c : {
           Case{{{.pp = 2, .dp = 2}}},
           Case{{{.tp = 2, .pp = 2}}},
           Case{{{.pp = 2, .virtual_stages = 2}, ScheduleKind::kInterleaved1F1B}},
           Case{{{.pp = 2, .dp = 2}, ScheduleKind::kGPipe}},
           Case{{{.tp = 2, .dp = 2}}, true},
       }) {
    const ParallelOptions& par = c.par;
    SCOPED_TRACE(absl::StrCat("tp ", par.tp, " pp ", par.pp, " dp ", par.dp, " ",
                              schedule_name(par.schedule), c.sequence_parallel ? " SP" : ""));
    model::TrainOptions with = o;
    with.activations.sequence_parallel = c.sequence_parallel;
    ASSERT_TRUE(par.validate(with).ok()) << par.validate(with);
    std::vector<model::StepMetrics> got;
    auto t = InProcessTrainer::create(with, par);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->run([&](const model::StepMetrics& m) { got.push_back(m); }).ok());
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); i++) {
      EXPECT_EQ(got[i].global_batch, want[i].global_batch);
      EXPECT_EQ(got[i].consumed_samples, want[i].consumed_samples);
      EXPECT_EQ(got[i].lr, want[i].lr);
      EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
      EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * want[i].grad_norm)
          << "step " << i + 1;
    }
  }
}

// The sample-based schedule: a run at a fixed batch of 4 reaches 16, 24 and
// 32 consumed samples at steps 5, 7 and 9; the ramped run at steps 5, 6
// and 7. Each pair trains with the same rate.
TEST(RampUpRuntime, ARampedRunSeesTheFixedRunsRateAtTheSameSample) {
  model::TrainOptions fixed = ramped();
  fixed.rampup = {};
  fixed.global_batch = 4;
  fixed.steps = *model::steps_for_samples({}, 4, fixed.train_samples);
  const std::vector<model::StepMetrics> a = single(ramped()), b = single(fixed);
  for (auto [ramped_step, fixed_step] : {std::pair{5, 5}, {6, 7}, {7, 9}}) {
    const model::StepMetrics& x = a[static_cast<std::size_t>(ramped_step - 1)];
    const model::StepMetrics& y = b[static_cast<std::size_t>(fixed_step - 1)];
    EXPECT_EQ(x.consumed_samples - x.global_batch, y.consumed_samples - y.global_batch);
    EXPECT_EQ(x.lr, y.lr) << "ramped step " << ramped_step << ", fixed step " << fixed_step;
  }
}

TEST(RampUpRuntime, ARampTheLayoutCannotRunIsAClearError) {
  model::TrainOptions o = ramped();
  const ParallelOptions dp4{{.dp = 4}};  // 4 is not a multiple of 2 x 4
  EXPECT_EQ(dp4.validate(o).message(),
            "--rampup-batch-size 4 4 40: START and INCREMENT must be multiples of "
            "--micro-batch-size x data-parallel size = 8");
  // Interleaved: every batch must be a multiple of pp micro-batches.
  o.rampup = {.start = 2, .increment = 2, .samples = 40};
  const ParallelOptions inter{{.pp = 2, .virtual_stages = 2}, ScheduleKind::kInterleaved1F1B};
  EXPECT_NE(inter.validate(o).message().find("the ramp's global batch 2 is 1 micro-batches"),
            std::string::npos)
      << inter.validate(o);
}

}  // namespace
}  // namespace troupe::actors
