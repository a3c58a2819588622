// The zero-bubble schedules in the runtime: zb-h1 and zb-auto (any
// --zb-max-pending-w) give bitwise the 1F1B run of the same layout, on tp x
// pp x dp layouts with recompute, sequence parallelism and bf16 (each
// parameter's gradient gets its parts in micro-batch order; only when a W
// runs changes); zbv, whose V places the layers differently, equals 1F1B
// with the same --pp within 1e-5 (the cross-layout contract), and zb-auto
// on the V (--virtual-stages 2) is bitwise zbv. Each stage
// holds the slots and stashes its list needs; bad layouts are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "actors/runtime/in_process.h"
#include "model/trainer.h"
#include "tests/actors/runtime_fixtures.h"

namespace troupe::actors {
namespace {

model::TrainOptions zb_tiny(const model::ActivationOptions& a = {}) {
  return fixtures::tiny({.layers = 8,
                         .micro_batch = 2,
                         .global_batch = 16,
                         .steps = 4,
                         .warmup_iters = 1,
                         .decay_iters = 4,
                         .activations = a});
}

ParallelOptions with(ParallelOptions par, ScheduleKind kind, int max_pending = 0) {
  par.schedule = kind;
  par.zb_max_pending_w = max_pending;
  EXPECT_TRUE(place_for_schedule(kind, &par).ok());
  return par;
}

void expect_bitwise(const fixtures::Trained& got, const fixtures::Trained& want) {
  ASSERT_EQ(got.metrics.size(), want.metrics.size());
  for (std::size_t i = 0; i < want.metrics.size(); i++) {
    EXPECT_EQ(std::memcmp(&got.metrics[i].loss, &want.metrics[i].loss, sizeof(double)), 0)
        << "step " << i + 1 << ": " << got.metrics[i].loss << " vs " << want.metrics[i].loss;
    EXPECT_EQ(std::memcmp(&got.metrics[i].grad_norm, &want.metrics[i].grad_norm, sizeof(double)), 0)
        << "step " << i + 1;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4), 0);
}

struct ZbCase {
  const char* name;
  comm::Layout layout;
  model::ActivationOptions activations;
};

TEST(ZeroBubbleRuntime, ZbH1AndZbAutoAreBitwiseThe1F1BRunOfTheSameLayout) {
  using enum model::Recompute;
  const ZbCase cases[] = {
      {"pp2", {.pp = 2}, {}},
      {"pp4", {.pp = 4}, {}},
      {"pp2 dp2", {.pp = 2, .dp = 2}, {}},
      {"tp2 pp2", {.tp = 2, .pp = 2}, {}},
      {"tp2 pp2 sequence parallel", {.tp = 2, .pp = 2}, {.sequence_parallel = true}},
      {"pp2 full recompute",
       {.pp = 2},
       {.recompute = kFull, .method = model::RecomputeMethod::kUniform, .recompute_layers = 2}},
      {"pp2 dp2 selective, reference attention",
       {.pp = 2, .dp = 2},
       {.recompute = kSelective, .attention = model::AttentionKernel::kReference}},
      {"pp2 bf16", {.pp = 2}, {.precision = gpu::Precision::kBf16}},
  };
  for (const ZbCase& c : cases) {
    SCOPED_TRACE(c.name);
    const model::TrainOptions o = zb_tiny(c.activations);
    const ParallelOptions base{c.layout, ScheduleKind::k1F1B};
    const fixtures::Trained want = fixtures::train_layout(o, base);
    {
      SCOPED_TRACE("zb-h1");
      expect_bitwise(fixtures::train_layout(o, with(base, ScheduleKind::kZbH1)), want);
    }
    {
      SCOPED_TRACE("zb-auto");
      expect_bitwise(fixtures::train_layout(o, with(base, ScheduleKind::kZbAuto)), want);
    }
  }
  // zb-auto holding one W at a time (every B waits for the last W).
  const model::TrainOptions o = zb_tiny();
  const ParallelOptions base{{.pp = 4}, ScheduleKind::k1F1B};
  expect_bitwise(fixtures::train_layout(o, with(base, ScheduleKind::kZbAuto, 1)),
                 fixtures::train_layout(o, base));
}

TEST(ZeroBubbleRuntime, ZbvEquals1F1BWithTheSamePpWithin1e5AndZbAutoOnItsVBitwise) {
  const std::pair<comm::Layout, bool> cases[] = {{{.pp = 2}, false},
                                                 {{.pp = 4}, false},
                                                 {{.tp = 2, .pp = 2}, false},
                                                 {{.tp = 2, .pp = 2}, true},
                                                 {{.pp = 2, .dp = 2}, false}};
  for (const auto& [l, sp] : cases) {
    SCOPED_TRACE(absl::StrCat(l.describe(), sp ? " sequence parallel" : ""));
    const model::TrainOptions o = zb_tiny({.sequence_parallel = sp});
    const fixtures::Trained want = fixtures::train_layout(o, {l, ScheduleKind::k1F1B});
    const fixtures::Trained got =
        fixtures::train_layout(o, with({l, ScheduleKind::k1F1B}, ScheduleKind::kZbV));
    ASSERT_EQ(got.metrics.size(), want.metrics.size());
    for (std::size_t i = 0; i < want.metrics.size(); i++) {
      const double a = want.metrics[i].loss, b = got.metrics[i].loss;
      const double na = want.metrics[i].grad_norm, nb = got.metrics[i].grad_norm;
      EXPECT_LE(std::abs(b - a) / std::abs(a), 1e-5) << "step " << i + 1;
      EXPECT_LE(std::abs(nb - na) / std::abs(na), 1e-5) << "step " << i + 1;
    }
    double worst = 0;
    for (std::size_t i = 0; i < want.params.size(); i++) {
      worst = std::max(worst, static_cast<double>(std::abs(got.params[i] - want.params[i])));
    }
    EXPECT_LE(worst, 1e-5);
    // zb-auto on the same V (--virtual-stages 2) is bitwise zbv.
    SCOPED_TRACE("zb-auto on a V");
    comm::Layout v2 = l;
    v2.virtual_stages = 2;
    expect_bitwise(
        fixtures::train_layout(o, with({v2, ScheduleKind::k1F1B}, ScheduleKind::kZbAuto)), got);
  }
}

// Slots (forward to B, + 1 where there are neighbours) and stashes (B to W)
// as schedule_zb_test.cc counts them by hand: zb-h1 at pp 4, m 8: 1F1B's
// pp - s slots and min(s + 1, m) stashes; zbv: chunk 0 holds 2pp - s, chunk
// 1 s + 1; zb-auto with --zb-max-pending-w 2: 2 stashes everywhere.
TEST(ZeroBubbleRuntime, EachStageHoldsTheSlotsAndStashesItsListNeeds) {
  const model::TrainOptions o = zb_tiny();  // m = 8
  const ParallelOptions base{{.pp = 4}, ScheduleKind::k1F1B};
  auto h1 = InProcessTrainer::create(o, with(base, ScheduleKind::kZbH1));
  ASSERT_TRUE(h1.ok()) << h1.status();
  for (int s = 0; s < 4; s++) {
    EXPECT_EQ((*h1)->slots(s, 0), 4 - s + 1) << s;
    EXPECT_EQ((*h1)->stashes(s, 0), s + 1) << s;
  }
  auto one = InProcessTrainer::create(o, base);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->stashes(3, 0), 0);  // 1F1B's backward is whole
  auto v = InProcessTrainer::create(o, with(base, ScheduleKind::kZbV));
  ASSERT_TRUE(v.ok()) << v.status();
  for (int s = 0; s < 4; s++) {
    EXPECT_EQ((*v)->slots(s, 0), 2 * 4 - s + 1) << s;
    EXPECT_EQ((*v)->slots(s, 1), s + 1 + 1) << s;
  }
  auto a = InProcessTrainer::create(o, with(base, ScheduleKind::kZbAuto, 2));
  ASSERT_TRUE(a.ok()) << a.status();
  for (int s = 0; s < 4; s++) EXPECT_EQ((*a)->stashes(s, 0), 2) << s;
}

// 300 micro-batches a step (past the 256 an 8-bit tag field named): pp 2
// in 1F1B and zb-h1 equal single-rank training within 1e-5.
TEST(ZeroBubbleRuntime, ThreeHundredMicroBatchesAStep) {
  model::TrainOptions o =
      fixtures::tiny({.layers = 2, .micro_batch = 1, .global_batch = 300, .steps = 1});
  auto single = model::Trainer::create(o);
  ASSERT_TRUE(single.ok()) << single.status();
  model::StepMetrics want;
  ASSERT_TRUE((*single)->step(&want).ok());
  for (ScheduleKind kind : {ScheduleKind::k1F1B, ScheduleKind::kZbH1}) {
    const fixtures::Trained got = fixtures::train_layout(o, with({{.pp = 2}}, kind));
    ASSERT_EQ(got.metrics.size(), 1u);
    EXPECT_LE(std::abs(got.metrics[0].loss - want.loss) / want.loss, 1e-5) << schedule_name(kind);
    EXPECT_LE(std::abs(got.metrics[0].grad_norm - want.grad_norm) / want.grad_norm, 1e-5);
  }
}

TEST(ZeroBubbleRuntime, LayoutsThatDoNotFitAreClearErrors) {
  model::TrainOptions o = zb_tiny();
  auto expect_error = [&](const ParallelOptions& par, const std::string& text) {
    auto t = InProcessTrainer::create(o, par);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(text), std::string::npos) << t.status();
  };
  o.model.L = 6;  // 2 stages x 2 chunks do not split 6 layers
  expect_error(with({{.pp = 2}}, ScheduleKind::kZbV),
               "--schedule zbv: --layers 6 does not split into 2 equal chunks on each of --pp 2");
  o.model.L = 8;
  expect_error({{.pp = 2}, ScheduleKind::kZbV}, "--schedule zbv runs 2 model chunks per stage");
  expect_error({{.pp = 2, .virtual_stages = 2, .v_shape = true}, ScheduleKind::k1F1B},
               "a V placement is zbv's (and zb-auto's with --virtual-stages 2), not --schedule "
               "1f1b's");
  expect_error({{.pp = 2, .virtual_stages = 2}, ScheduleKind::kZbAuto},
               "--schedule zb-auto --virtual-stages 2 runs 2 model chunks per stage placed in a V");
  o.model.L = 6;
  expect_error(
      with({{.pp = 2, .virtual_stages = 2}}, ScheduleKind::kZbAuto),
      "--schedule zb-auto: --layers 6 does not split into 2 equal chunks on each of --pp 2");
  o.model.L = 8;
  ParallelOptions bad = with({{.pp = 2}}, ScheduleKind::kZbH1);
  bad.zb_max_pending_w = 2;
  expect_error(bad,
               "--zb-max-pending-w 2: a number of micro-batches (>= 1) for --schedule zb-auto");
  comm::Layout one{.pp = 1};
  EXPECT_EQ(place_for_schedule(ScheduleKind::kZbV, &one).message(),
            "--schedule zbv places 2 model chunks per stage in a V across the pipeline's "
            "stages; --pp 1 has none (use --pp 2 or more)");
  comm::Layout three{.pp = 2, .virtual_stages = 3};
  EXPECT_EQ(place_for_schedule(ScheduleKind::kZbV, &three).message(),
            "--schedule zbv places 2 model chunks on each stage in a V; --virtual-stages 3 does "
            "not fit it");
  EXPECT_EQ(place_for_schedule(ScheduleKind::kZbAuto, &three).message(),
            "--schedule zb-auto runs zb-h1's order on one model chunk per stage, or "
            "(--virtual-stages 2) zbv's on two in a V; --virtual-stages 3 does not fit it");
}

}  // namespace
}  // namespace troupe::actors
