// Pipeline schedules: order, deadlock freedom under a global simulation,
// in-flight activations, and the bubble (idle fraction) with unit-time ops.
#include "actors/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

namespace troupe::actors {
namespace {

struct Sim {
  int makespan = 0;  // in op times (one op = one model chunk, forward or backward)
  bool deadlock = false;
};

// Every stage runs its list in order; an op starts as soon as its input is
// there: F(mb) of global chunk g needs F(mb) of g-1; B(mb) of g needs B(mb)
// of g+1 (or, on the last chunk, its own F). Ops take one time unit.
Sim simulate(ScheduleKind kind, int pp, int m, int v) {
  std::vector<std::vector<ScheduleOp>> lists;
  for (int s = 0; s < pp; s++) lists.push_back(*make_schedule(kind, pp, s, m, v));
  std::map<std::tuple<int, int, int>, int> done_at;  // (kind, micro, global chunk) -> end time
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  std::vector<int> free_at(static_cast<std::size_t>(pp), 0);
  const int chunks = pp * v;
  Sim sim;
  std::size_t remaining = 0;
  for (auto& l : lists) remaining += l.size();
  for (int t = 0; remaining > 0; t++) {
    if (t > 100000) {
      sim.deadlock = true;
      return sim;
    }
    std::vector<std::tuple<int, int, int, int>> finished;  // commit after the step
    for (int s = 0; s < pp; s++) {
      const auto su = static_cast<std::size_t>(s);
      if (next[su] >= lists[su].size() || free_at[su] > t) continue;
      const ScheduleOp& op = lists[su][next[su]];
      const int g = op.chunk * pp + s;
      auto ready = [&](int k, int mb, int chunk) {
        auto it = done_at.find({k, mb, chunk});
        return it != done_at.end() && it->second <= t;
      };
      bool ok;
      if (op.kind == OpKind::kForward) {
        ok = g == 0 || ready(0, op.micro, g - 1);
      } else {
        ok = ready(0, op.micro, g) && (g == chunks - 1 || ready(1, op.micro, g + 1));
      }
      if (!ok) continue;
      finished.emplace_back(op.kind == OpKind::kForward ? 0 : 1, op.micro, g, t + 1);
      free_at[su] = t + 1;
      next[su]++;
      remaining--;
      sim.makespan = std::max(sim.makespan, t + 1);
    }
    for (auto& [k, mb, g, end] : finished) done_at[{k, mb, g}] = end;
  }
  return sim;
}

TEST(Schedule, OneFOneBInMegatronOrder) {
  auto ops = *make_schedule(ScheduleKind::k1F1B, 4, 1, 6, 1);
  // pp - s - 1 = 2 warm-up forwards, then F2 B0 F3 B1 F4 B2 F5 B3, then B4 B5.
  std::vector<std::pair<OpKind, int>> want = {
      {OpKind::kForward, 0},  {OpKind::kForward, 1},  {OpKind::kForward, 2},
      {OpKind::kBackward, 0}, {OpKind::kForward, 3},  {OpKind::kBackward, 1},
      {OpKind::kForward, 4},  {OpKind::kBackward, 2}, {OpKind::kForward, 5},
      {OpKind::kBackward, 3}, {OpKind::kBackward, 4}, {OpKind::kBackward, 5}};
  ASSERT_EQ(ops.size(), want.size());
  for (std::size_t i = 0; i < ops.size(); i++) {
    EXPECT_EQ(ops[i].kind, want[i].first) << i;
    EXPECT_EQ(ops[i].micro, want[i].second) << i;
    EXPECT_EQ(ops[i].id, static_cast<int>(i));
  }
}

struct Case {
  ScheduleKind kind;
  int pp, m, v;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int pp = 1; pp <= 8; pp++) {
    for (int m = 1; m <= 32; m++) {
      out.push_back({ScheduleKind::kGPipe, pp, m, 1});
      out.push_back({ScheduleKind::k1F1B, pp, m, 1});
      if (m % pp == 0)
        for (int v = 1; v <= 4; v++) out.push_back({ScheduleKind::kInterleaved1F1B, pp, m, v});
    }
  }
  return out;
}

TEST(Schedule, EveryForwardPrecedesItsBackwardAndEachRunsOnce) {
  for (const Case& c : cases()) {
    for (int s = 0; s < c.pp; s++) {
      auto ops = *make_schedule(c.kind, c.pp, s, c.m, c.v);
      ASSERT_EQ(ops.size(), static_cast<std::size_t>(2 * c.m * c.v));
      std::map<std::pair<int, int>, int> fwd_at, bwd_at;
      for (const ScheduleOp& op : ops) {
        auto& table = op.kind == OpKind::kForward ? fwd_at : bwd_at;
        ASSERT_TRUE(table.emplace(std::make_pair(op.micro, op.chunk), op.id).second) << "twice";
      }
      for (auto& [key, b] : bwd_at) ASSERT_LT(fwd_at.at(key), b);
    }
  }
}

TEST(Schedule, NeverDeadlocksAndTheBubbleIsMegatrons) {
  for (const Case& c : cases()) {
    Sim sim = simulate(c.kind, c.pp, c.m, c.v);
    ASSERT_FALSE(sim.deadlock) << schedule_name(c.kind) << " pp=" << c.pp << " m=" << c.m
                               << " v=" << c.v;
    // Ideal time per stage is 2*m*v op times; the idle fraction is
    // (pp-1)/(m+pp-1) for GPipe and 1F1B, (pp-1)/(v*m+pp-1) interleaved.
    const int ideal = 2 * c.m * c.v;
    const double idle = static_cast<double>(sim.makespan - ideal) / sim.makespan;
    const double want = static_cast<double>(c.pp - 1) / (c.v * c.m + c.pp - 1);
    EXPECT_NEAR(idle, want, 1e-12)
        << schedule_name(c.kind) << " pp=" << c.pp << " m=" << c.m << " v=" << c.v;
  }
}

TEST(Schedule, InFlightActivationsPeakAsExpected) {
  for (const Case& c : cases()) {
    for (int s = 0; s < c.pp; s++) {
      int live = 0, peak = 0;
      const std::vector<ScheduleOp> ops = *make_schedule(c.kind, c.pp, s, c.m, c.v);
      for (const ScheduleOp& op : ops) {
        live += op.kind == OpKind::kForward ? 1 : -1;
        peak = std::max(peak, live);
      }
      int want = 0;
      switch (c.kind) {
        case ScheduleKind::kGPipe:
          want = c.m;
          break;
        case ScheduleKind::k1F1B:
          want = std::min(c.pp - s, c.m);
          break;
        case ScheduleKind::kInterleaved1F1B:
          want = std::min(warmup_forwards(c.kind, c.pp, s, c.m, c.v) + 1, c.m * c.v);
          break;
      }
      EXPECT_EQ(peak, want) << schedule_name(c.kind) << " pp=" << c.pp << " s=" << s
                            << " m=" << c.m;
    }
  }
}

TEST(Schedule, BadSizesAreClearErrors) {
  EXPECT_EQ(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 0, 6, 2).status().message(),
            "interleaved schedule: the 6 micro-batches per step must be a multiple of --pp 4");
  EXPECT_FALSE(make_schedule(ScheduleKind::k1F1B, 4, 4, 8, 1).ok());
  EXPECT_EQ(check_layer_split(10, 4, 1).message(),
            "--layers 10 does not split into --pp 4 x --virtual-stages 1 = 4 equal model chunks");
  EXPECT_TRUE(check_layer_split(8, 2, 2).ok());
  EXPECT_EQ(parse_schedule("zb").status().message(),
            "--schedule 'zb': choose gpipe, 1f1b or interleaved");
}

}  // namespace
}  // namespace troupe::actors
