// The planner's point-to-point as Megatron's and DeepSpeed's pipelines ran
// it: blocking sends (--blocking-p2p) against a timeline worked by hand,
// and the scatter/gather of a message across TP ranks (--p2p-scatter-gather)
// against its formula.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "launcher/plan/cost.h"
#include "launcher/plan/hardware.h"
#include "launcher/plan/sim.h"
#include "tests/plan/fixed_costs.h"
#include "tests/plan/selene.h"

namespace troupe::launcher::plan {
namespace {

// pp 2, 1F1B, two micro-batches, a layer a stage: F 1, B 2, a hop 0.25.
// Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1. A sender waits for its
// message to be through; a message goes once its receiver has posted the
// receive, which a stage does between ops for its next forward's and next
// backward's inputs. By hand:
//   s0 F0 [0, 1]; its activation goes at once (s1 posted at 0): [1, 1.25]
//   s0 F1 [1.25, 2.25]            s1 F0 [1.25, 2.25], B0 [2.25, 4.25]
//   s0's F1 activation [2.25, 2.5] (s1 posted it at 2.25, between F0 and B0)
//   s1's B0 gradient [4.25, 4.5]; s1 F1 [4.5, 5.5], B1 [5.5, 7.5]
//   s0 B0 [4.5, 6.5]; s1's B1 gradient [7.5, 7.75]; s0 B1 [7.75, 9.75]
// Sent without waiting (troupe's), the same step takes 9.5: s0 F1 [1, 2],
// s1 F1 [4.25, 5.25], B1 [5.25, 7.25], s0 B1 [7.5, 9.5].
TEST(PlanP2p, BlockingSendsWaitForTheirMessages) {
  PlanInput in = layout(2, 2, 2, actors::ScheduleKind::k1F1B);
  absl::StatusOr<SimResult> free = simulate(in, FixedCosts(1.0, 2.0, 0.25), false);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_NEAR(free->step_s, 9.5, 1e-12);
  in.blocking_p2p = true;
  absl::StatusOr<SimResult> blocking = simulate(in, FixedCosts(1.0, 2.0, 0.25), true);
  ASSERT_TRUE(blocking.ok()) << blocking.status();
  EXPECT_NEAR(blocking->step_s, 9.75, 1e-12);
  // Each message recorded when it went.
  std::vector<double> went;
  for (const SimMessage& msg : blocking->messages) went.push_back(msg.sent);
  EXPECT_EQ(went, (std::vector<double>{1.0, 2.25, 4.25, 7.5}));
}

// A message waits for its receiver to post the receive. GPipe on pp 2, two
// micro-batches of a layer a stage, stage 0 F 1 and B 2, stage 1 twice
// that, a hop 0.25: stage 0's second activation is ready at 2.25 but stage 1, in its
// first forward until 3.25, posts that receive only then. By hand:
//   s0 F0 [0, 1], its activation [1, 1.25]; s0 F1 [1.25, 2.25]
//   s1 F0 [1.25, 3.25]; s0's F1 activation [3.25, 3.5], s0 held till then
//   s1 F1 [3.5, 5.5], B0 [5.5, 9.5]; its gradient [9.5, 9.75]
//   s0 B0 [9.75, 11.75]; s1 B1 [9.75, 13.75]; its gradient [13.75, 14]
//   s0 B1 [14, 16]
// Sent without waiting for the receive, F1's activation would go at 2.25
// and the step end at 15.75.
TEST(PlanP2p, AMessageWaitsForItsReceiversReceive) {
  PlanInput in = layout(2, 2, 2, actors::ScheduleKind::kGPipe);
  in.blocking_p2p = true;
  absl::StatusOr<SimResult> r = simulate(in, FixedCosts(1.0, 2.0, 0.25, /*head=*/2), true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->step_s, 16.0, 1e-12);
  std::vector<double> went;
  for (const SimMessage& msg : r->messages) went.push_back(msg.sent);
  EXPECT_EQ(went, (std::vector<double>{1.0, 3.25, 9.5, 13.75}));
  // Stage 0, the one with the most idle time: held 0.25 and 1.25 by its
  // sends, and waiting on the gradients' flights 0.25 each.
  EXPECT_EQ(r->exposed_stage, 0);
  EXPECT_NEAR(r->p2p_exposed_s, 2.0, 1e-12);
}

// Messages that cost nothing cost nothing blocking too, on every schedule
// Megatron has (the closed forms of plan_test.cc): no schedule deadlocks on
// a send that waits for its receive.
TEST(PlanP2p, BlockingSendsKeepTheClosedFormsWhenMessagesAreFree) {
  struct Case {
    int L, pp, m, v;
    actors::ScheduleKind kind;
  };
  const std::vector<Case> cases = {{4, 4, 8, 1, actors::ScheduleKind::k1F1B},
                                   {4, 4, 8, 1, actors::ScheduleKind::kGPipe},
                                   {8, 4, 8, 2, actors::ScheduleKind::kInterleaved1F1B},
                                   {12, 4, 8, 3, actors::ScheduleKind::kInterleaved1F1B},
                                   {35, 35, 120, 1, actors::ScheduleKind::k1F1B}};
  for (const Case& c : cases) {
    PlanInput in = layout(c.L, c.pp, c.m, c.kind, c.v);
    in.blocking_p2p = true;
    absl::StatusOr<SimResult> r = simulate(in, FixedCosts(1.0, 2.0), false);
    ASSERT_TRUE(r.ok()) << r.status();
    const double layers = static_cast<double>(c.L) / c.pp;
    EXPECT_NEAR(r->step_s, (c.m * c.v + c.pp - 1) * 3.0 * layers / c.v, 1e-9)
        << "L=" << c.L << " pp=" << c.pp << " v=" << c.v;
  }
}

// The zero-bubble schedules under blocking sends run to the end (ZB-V's two
// chunks a stage once deadlocked them) and are never faster than sending
// freely. (Not the same: with F 1 and B 2, not the F = B = W it is made
// for, ZB-V has senders done before their receivers, which then wait.)
TEST(PlanP2p, BlockingSendsNeverDeadlockTheZeroBubbleSchedules) {
  for (const auto& [kind, L, pp, m] : std::vector<std::tuple<actors::ScheduleKind, int, int, int>>{
           {actors::ScheduleKind::kZbH1, 4, 4, 8},
           {actors::ScheduleKind::kZbV, 8, 4, 8},
           {actors::ScheduleKind::kZbV, 16, 8, 16},
           {actors::ScheduleKind::kZbV, 6, 3, 5}}) {
    PlanInput in = layout(L, pp, m, kind);
    ASSERT_TRUE(actors::place_for_schedule(in.parallel.schedule, &in.parallel).ok());
    absl::StatusOr<SimResult> free = simulate(in, FixedCosts(1.0, 2.0), false);
    in.blocking_p2p = true;
    absl::StatusOr<SimResult> blocking = simulate(in, FixedCosts(1.0, 2.0), false);
    ASSERT_TRUE(free.ok()) << free.status();
    ASSERT_TRUE(blocking.ok()) << blocking.status() << " L " << L << " pp " << pp;
    EXPECT_GE(blocking->step_s, free->step_s - 1e-9) << "L " << L << " pp " << pp;
  }
}

// Scatter/gather on Selene, tp 8, stages on two nodes: each TP rank sends
// 1/8 of the activation over its InfiniBand share (8 us, 25 GB/s) and the
// eight all-gather it over NVLink (7 steps of 5 us, 7/8 of the bytes at
// 0.73 x 300 GB/s); without it, the whole activation over InfiniBand. With
// sequence parallelism the activation is already split: 1/8, no gather.
TEST(PlanP2p, ScatterGatherSendsATpShareAndGathersOverNvlink) {
  const Cluster c = selene();
  absl::StatusOr<Device> d = c.device(8, Precision::kBf16);
  ASSERT_TRUE(d.ok());
  PlanInput in = layout(2, 2, 1, actors::ScheduleKind::k1F1B);
  in.parallel.tp = 8;
  in.model.NH = 8;
  in.model.C = 1024;
  in.model.T = 2048;
  in.micro_batch = 2;
  const double bytes = 2.0 * 2048 * 1024 * 2;  // B T C, bf16
  EXPECT_NEAR(CostModel(in, c, *d).p2p_seconds(0, 1), 8e-6 + bytes / 25e9, 1e-12);
  in.p2p_scatter_gather = true;
  EXPECT_NEAR(CostModel(in, c, *d).p2p_seconds(0, 1),
              8e-6 + bytes / 8 / 25e9 + 7 * 5e-6 + 7.0 / 8 * bytes / (0.73 * 300e9), 1e-12);
  in.sequence_parallel = true;
  EXPECT_NEAR(CostModel(in, c, *d).p2p_seconds(0, 1), 8e-6 + bytes / 8 / 25e9, 1e-12);
}

}  // namespace
}  // namespace troupe::launcher::plan
