// Pipeline schedules: order, deadlock freedom under a global simulation,
// in-flight activations, and the bubble (idle fraction) with unit-time ops.
// Expected orders and peaks are hand-computed from Megatron-LM's
// megatron/schedules.py (forward_backward_pipelining_without_interleaving
// and _with_interleaving, as of 0504208), never from schedule.cc.
#include "actors/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
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

// A stage's list written as text: "F0.1" is the forward of micro-batch 1 of
// model chunk 0, "B1.0" the backward of micro-batch 0 of chunk 1.
std::string as_text(const std::vector<ScheduleOp>& ops) {
  std::string out;
  for (const ScheduleOp& op : ops) {
    if (!out.empty()) out += ' ';
    out += op.kind == OpKind::kForward ? 'F' : 'B';
    out += std::to_string(op.chunk) + "." + std::to_string(op.micro);
  }
  return out;
}

// Megatron's interleaved 1F1B by hand, pp = 2, v = 2, m = 4 (8 ops each
// way per stage). Warm-up forwards: (pp - s - 1) * 2 + (v - 1) * pp, so 4 on
// stage 0 and 2 on stage 1. The k-th forward runs chunk (k mod pp*v) / pp
// (chunks 0 0 1 1 0 0 1 1), the k-th backward chunk v - 1 - that (1 1 0 0 1
// 1 0 0); each chunk takes its micro-batches in order, first in first out.
TEST(Schedule, InterleavedInMegatronOrder) {
  EXPECT_EQ(as_text(*make_schedule(ScheduleKind::kInterleaved1F1B, 2, 0, 4, 2)),
            // warm-up: F0..F3; steady: F4 B0 F5 B1 F6 B2 F7 B3; cool-down: B4..B7
            "F0.0 F0.1 F1.0 F1.1 "
            "F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 "
            "B1.2 B1.3 B0.2 B0.3");
  EXPECT_EQ(as_text(*make_schedule(ScheduleKind::kInterleaved1F1B, 2, 1, 4, 2)),
            // warm-up: F0 F1; steady: F2 B0 ... F7 B5; cool-down: B6 B7
            "F0.0 F0.1 "
            "F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 "
            "B0.2 B0.3");
  // m == pp: Megatron runs every forward first, then every backward.
  for (int s = 0; s < 2; s++) {
    EXPECT_EQ(as_text(*make_schedule(ScheduleKind::kInterleaved1F1B, 2, s, 2, 2)),
              "F0.0 F0.1 F1.0 F1.1 B1.0 B1.1 B0.0 B0.1")
        << "stage " << s;
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
        ASSERT_TRUE(op.micro >= 0 && op.micro < c.m && op.chunk >= 0 && op.chunk < c.v)
            << "micro-batch " << op.micro << " chunk " << op.chunk;
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

// Every link (a stage to another, activations or gradients) carries its
// messages in the order the receiving stage consumes them: the sender's
// list order of the ops that produce them equals the receiver's list order
// of the ops that read them. (In-order channels, as NCCL's point-to-point
// calls between two ranks, need this; tagged messages do not.) Brute force
// over every list, from the chunk arithmetic alone.
TEST(Schedule, EveryLinkCarriesItsMessagesInTheOrderTheyAreConsumed) {
  using Link = std::tuple<int, int, int>;  // (kind 0 activation / 1 gradient, from, to)
  using Msg = std::pair<int, int>;         // (micro-batch, the receiving global chunk)
  for (const Case& c : cases()) {
    const int chunks = c.pp * c.v;
    std::map<Link, std::vector<Msg>> sent, consumed;
    for (int s = 0; s < c.pp; s++) {
      const absl::StatusOr<std::vector<ScheduleOp>> ops = make_schedule(c.kind, c.pp, s, c.m, c.v);
      ASSERT_TRUE(ops.ok()) << ops.status();
      for (const ScheduleOp& op : *ops) {
        const int g = op.chunk * c.pp + s;
        if (op.kind == OpKind::kForward) {
          if (g + 1 < chunks) sent[{0, s, (g + 1) % c.pp}].emplace_back(op.micro, g + 1);
          if (g > 0) consumed[{0, (g - 1) % c.pp, s}].emplace_back(op.micro, g);
        } else {
          if (g > 0) sent[{1, s, (g - 1) % c.pp}].emplace_back(op.micro, g - 1);
          if (g + 1 < chunks) consumed[{1, (g + 1) % c.pp, s}].emplace_back(op.micro, g);
        }
      }
    }
    ASSERT_EQ(sent.size(), consumed.size());
    for (const auto& [link, msgs] : sent) {
      const auto [kind, from, to] = link;
      EXPECT_EQ(msgs, consumed[link])
          << schedule_name(c.kind) << " pp=" << c.pp << " m=" << c.m << " v=" << c.v << ": "
          << (kind == 0 ? "activations" : "gradients") << " from stage " << from << " to " << to;
    }
  }
}

// Micro-batch chunks whose forward has run and backward has not, at most,
// on one stage (all chunks together, or only `chunk`).
int live_peak(const std::vector<ScheduleOp>& ops, int chunk = -1) {
  int live = 0, peak = 0;
  for (const ScheduleOp& op : ops) {
    if (chunk >= 0 && op.chunk != chunk) continue;
    live += op.kind == OpKind::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

// GPipe keeps all m; 1F1B (PipeDream-flush) keeps pp - s on stage s.
TEST(Schedule, InFlightActivationsPeakAsTheoryForGPipeAnd1F1B) {
  for (const Case& c : cases()) {
    if (c.kind == ScheduleKind::kInterleaved1F1B) continue;
    for (int s = 0; s < c.pp; s++) {
      const int want = c.kind == ScheduleKind::kGPipe ? c.m : std::min(c.pp - s, c.m);
      EXPECT_EQ(live_peak(*make_schedule(c.kind, c.pp, s, c.m, c.v)), want)
          << schedule_name(c.kind) << " pp=" << c.pp << " s=" << s << " m=" << c.m;
    }
  }
}

// Interleaved, by hand from Megatron's warm-up count w = (pp - s - 1) * 2 +
// (v - 1) * pp (all m * v when m == pp): w forwards, then one more before
// the first backward, so w + 1 in flight at most.
TEST(Schedule, InterleavedInFlightPeaksAsMegatron) {
  struct Want {
    int pp, m, v;
    std::vector<int> peak;  // per stage
  };
  const std::vector<Want> table = {
      {2, 4, 1, {3, 1}},                            // w = 2, 0 (not 1F1B's 1, 0)
      {2, 4, 2, {5, 3}},                            // w = 4, 2
      {2, 2, 2, {4, 4}},                            // m == pp: all 4 first
      {3, 6, 2, {8, 6, 4}},                         // w = 7, 5, 3
      {4, 4, 3, {12, 12, 12, 12}},                  // m == pp
      {4, 8, 2, {11, 9, 7, 5}},                     // w = 10, 8, 6, 4
      {4, 8, 3, {15, 13, 11, 9}},                   // w = 14, 12, 10, 8
      {4, 12, 4, {19, 17, 15, 13}},                 // w = 18, 16, 14, 12
      {8, 16, 2, {23, 21, 19, 17, 15, 13, 11, 9}},  // w = 22, 20, ..., 8
  };
  for (const Want& w : table) {
    for (int s = 0; s < w.pp; s++) {
      EXPECT_EQ(live_peak(*make_schedule(ScheduleKind::kInterleaved1F1B, w.pp, s, w.m, w.v)),
                w.peak[static_cast<std::size_t>(s)])
          << "pp=" << w.pp << " m=" << w.m << " v=" << w.v << " s=" << s;
    }
  }
  // Per chunk (what the runtime and the planner size activation slots by,
  // actors::peak_in_flight), from the hand-written lists of
  // InterleavedInMegatronOrder.
  const auto s0 = *make_schedule(ScheduleKind::kInterleaved1F1B, 2, 0, 4, 2);
  const auto s1 = *make_schedule(ScheduleKind::kInterleaved1F1B, 2, 1, 4, 2);
  EXPECT_EQ(actors::peak_in_flight(s0, 0), 4);
  EXPECT_EQ(actors::peak_in_flight(s0, 1), 2);
  EXPECT_EQ(actors::peak_in_flight(s1, 0), 3);
  EXPECT_EQ(actors::peak_in_flight(s1, 1), 1);
}

// Megatron's warm-up counts, by hand (see above).
TEST(Schedule, WarmupForwardsAsMegatron) {
  EXPECT_EQ(warmup_forwards(ScheduleKind::kGPipe, 4, 1, 6, 1), 6);
  EXPECT_EQ(warmup_forwards(ScheduleKind::k1F1B, 4, 0, 6, 1), 3);
  EXPECT_EQ(warmup_forwards(ScheduleKind::k1F1B, 4, 3, 6, 1), 0);
  EXPECT_EQ(warmup_forwards(ScheduleKind::k1F1B, 8, 0, 3, 1), 3);  // capped at m
  EXPECT_EQ(warmup_forwards(ScheduleKind::kInterleaved1F1B, 4, 0, 8, 2), 10);
  EXPECT_EQ(warmup_forwards(ScheduleKind::kInterleaved1F1B, 4, 3, 8, 2), 4);
  EXPECT_EQ(warmup_forwards(ScheduleKind::kInterleaved1F1B, 4, 1, 4, 2), 8);  // m == pp
}

TEST(Schedule, BadSizesAreClearErrors) {
  EXPECT_EQ(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 0, 6, 2).status().message(),
            "interleaved schedule: the 6 micro-batches per step must be a multiple of --pp 4");
  EXPECT_FALSE(make_schedule(ScheduleKind::k1F1B, 4, 4, 8, 1).ok());
  EXPECT_EQ(check_layer_split(10, 4, 1).message(),
            "--layers 10 does not split into --pp 4 x --virtual-stages 1 = 4 equal model chunks");
  EXPECT_TRUE(check_layer_split(8, 2, 2).ok());
  EXPECT_EQ(parse_schedule("zb").status().message(),
            "--schedule 'zb': choose gpipe, 1f1b, interleaved, zb-h1, zbv or zb-auto");
}

}  // namespace
}  // namespace troupe::actors
