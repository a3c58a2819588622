// The zero-bubble schedules (zb-h1, zbv, zb-auto's starting order) against
// a brute-force simulation of every stage with given op times: each op
// once and after what it needs, never a deadlock, each link's messages in
// the order they are consumed, the step as long as the paper's formula for
// ZB-H1 (Qi et al., ICLR 2024, section 3: m(F+B+W) + (p-1)(F+B-W)) and as
// the V's least for ZB-V (the last stage waits (p-1) chunk forwards, then
// never again: 6m + p - 1 chunk-op times), and the slots and stashes each
// stage needs, counted by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "actors/schedule.h"
#include "comm/groups.h"

namespace troupe::actors {
namespace {

struct Costs {
  int f = 1, b = 1, w = 1;
};

struct StepSim {
  int makespan = 0;
  bool deadlock = false;
};

// A chunk's virtual stage: the V of zbv, else 1F1B's one chunk per stage.
comm::Layout layout_of(ScheduleKind kind, int pp) {
  comm::Layout l{.pp = pp};
  if (kind == ScheduleKind::kZbV) {
    l.virtual_stages = 2;
    l.v_shape = true;
  }
  return l;
}

// Every stage runs its list in order, each op as soon as what it needs is
// done: F(mb) of virtual stage g needs F(mb) of g-1; B(mb) needs B(mb) of
// g+1 (the last: its own F); W(mb) its own B.
StepSim simulate_step(ScheduleKind kind, int pp, int m, Costs c) {
  const comm::Layout lay = layout_of(kind, pp);
  const int v = lay.virtual_stages, chunks = lay.chunks();
  std::vector<std::vector<ScheduleOp>> lists;
  for (int s = 0; s < pp; s++) lists.push_back(*make_schedule(kind, pp, s, m, v));
  std::map<std::tuple<OpKind, int, int>, int> done;  // (kind, micro, vs) -> end time
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  std::vector<int> free_at(static_cast<std::size_t>(pp), 0);
  StepSim sim;
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < pp; s++) {
      const auto su = static_cast<std::size_t>(s);
      while (next[su] < lists[su].size()) {
        const ScheduleOp& op = lists[su][next[su]];
        const int g = lay.virtual_stage(s, op.chunk);
        std::tuple<OpKind, int, int> need;
        bool none = false;
        switch (op.kind) {
          case OpKind::kForward:
            need = {OpKind::kForward, op.micro, g - 1};
            none = g == 0;
            break;
          case OpKind::kBackward:
            need = g == chunks - 1 ? std::tuple{OpKind::kForward, op.micro, g}
                                   : std::tuple{OpKind::kBackward, op.micro, g + 1};
            break;
          case OpKind::kWeight:
            need = {OpKind::kBackward, op.micro, g};
            break;
        }
        int start = free_at[su];
        if (!none) {
          auto it = done.find(need);
          if (it == done.end()) break;
          start = std::max(start, it->second);
        }
        const int cost = op.kind == OpKind::kForward    ? c.f
                         : op.kind == OpKind::kBackward ? c.b
                                                        : c.w;
        free_at[su] = start + cost;
        done[{op.kind, op.micro, g}] = free_at[su];
        sim.makespan = std::max(sim.makespan, free_at[su]);
        next[su]++;
        moved = true;
      }
    }
  }
  for (int s = 0; s < pp; s++) {
    if (next[static_cast<std::size_t>(s)] < lists[static_cast<std::size_t>(s)].size()) {
      sim.deadlock = true;
    }
  }
  return sim;
}

const ScheduleKind kZb[] = {ScheduleKind::kZbH1, ScheduleKind::kZbV, ScheduleKind::kZbAuto};

TEST(ZeroBubbleSchedule, EveryOpOnceAndEachAfterWhatItNeedsOnItsStage) {
  for (ScheduleKind kind : kZb) {
    for (int pp = 1; pp <= 8; pp++) {
      for (int m = 1; m <= 32; m++) {
        const int v = layout_of(kind, pp).virtual_stages;
        for (int s = 0; s < pp; s++) {
          const auto ops = make_schedule(kind, pp, s, m, v);
          ASSERT_TRUE(ops.ok()) << ops.status();
          ASSERT_EQ(ops->size(), static_cast<std::size_t>(3 * m * v));
          std::map<std::tuple<OpKind, int, int>, int> at;
          for (const ScheduleOp& op : *ops) {
            ASSERT_TRUE(op.micro >= 0 && op.micro < m && op.chunk >= 0 && op.chunk < v);
            ASSERT_TRUE(at.emplace(std::tuple{op.kind, op.micro, op.chunk}, op.id).second);
          }
          for (int j = 0; j < m; j++) {
            for (int c = 0; c < v; c++) {
              ASSERT_LT(at.at({OpKind::kForward, j, c}), at.at({OpKind::kBackward, j, c}));
              ASSERT_LT(at.at({OpKind::kBackward, j, c}), at.at({OpKind::kWeight, j, c}));
            }
          }
        }
      }
    }
  }
}

TEST(ZeroBubbleSchedule, NeverDeadlocksAndTheStepIsThePapersForZbH1AndTheVsLeastForZbV) {
  for (ScheduleKind kind : kZb) {
    for (int pp = 1; pp <= 8; pp++) {
      for (int m = 1; m <= 32; m++) {
        for (const Costs c : {Costs{1, 1, 1}, Costs{1, 2, 1}, Costs{2, 2, 1}, Costs{2, 3, 1}}) {
          // (Unequal costs up to m = 16: the formula's cases, in less time under ASan.)
          if (m > 16 && c.f + c.b + c.w != 3) continue;
          const StepSim sim = simulate_step(kind, pp, m, c);
          ASSERT_FALSE(sim.deadlock) << schedule_name(kind) << " pp=" << pp << " m=" << m;
          if (kind != ScheduleKind::kZbV && m >= pp) {
            EXPECT_EQ(sim.makespan, m * (c.f + c.b + c.w) + (pp - 1) * (c.f + c.b - c.w))
                << schedule_name(kind) << " pp=" << pp << " m=" << m << " F:B:W " << c.f << ":"
                << c.b << ":" << c.w;
          }
          if (kind == ScheduleKind::kZbV && m >= 2 * pp - 1 && c.f == 1 && c.b == 1 && c.w == 1) {
            EXPECT_EQ(sim.makespan, 6 * m + pp - 1) << "pp=" << pp << " m=" << m;
          }
        }
      }
    }
  }
}

// As for the other schedules (schedule_test.cc): the sender's order of the
// ops that make a link's messages is the receiver's order of the ops that
// read them, with zbv's V placement.
TEST(ZeroBubbleSchedule, EveryLinkCarriesItsMessagesInTheOrderTheyAreConsumed) {
  using Link = std::tuple<int, int, int>;  // (0 activation / 1 gradient, from, to)
  using Msg = std::pair<int, int>;         // (micro-batch, receiving virtual stage)
  for (ScheduleKind kind : kZb) {
    for (int pp = 1; pp <= 8; pp++) {
      for (int m = 1; m <= 24; m++) {
        const comm::Layout lay = layout_of(kind, pp);
        const int chunks = lay.chunks();
        std::map<Link, std::vector<Msg>> sent, consumed;
        for (int s = 0; s < pp; s++) {
          const std::vector<ScheduleOp> ops =
              make_schedule(kind, pp, s, m, lay.virtual_stages).value();
          for (const ScheduleOp& op : ops) {
            const int g = lay.virtual_stage(s, op.chunk);
            if (op.kind == OpKind::kForward) {
              if (g + 1 < chunks) sent[{0, s, lay.stage_of(g + 1)}].emplace_back(op.micro, g + 1);
              if (g > 0) consumed[{0, lay.stage_of(g - 1), s}].emplace_back(op.micro, g);
            } else if (op.kind == OpKind::kBackward) {
              if (g > 0) sent[{1, s, lay.stage_of(g - 1)}].emplace_back(op.micro, g - 1);
              if (g + 1 < chunks) consumed[{1, lay.stage_of(g + 1), s}].emplace_back(op.micro, g);
            }
          }
        }
        for (const auto& [link, msgs] : sent) {
          EXPECT_EQ(msgs, consumed[link]) << schedule_name(kind) << " pp=" << pp << " m=" << m;
        }
      }
    }
  }
}

// Slots (F to B) and stashes (B to W) per chunk, by hand from the rules in
// schedule_zb.cc. ZB-H1: 1F1B's forwards and B's, so 1F1B's pp - s slots;
// stage s holds its first d = min(s, m - warm-up) W's, so d + 1 stashes (at
// most m). ZB-V (m >= 2pp): chunk 0 takes 2(pp-s)-1 warm-up forwards and s
// more before its first B, so 2pp - s slots; chunk 1's forwards each meet
// their B within s + 1; stashes are counted from the lists at pp = 4.
TEST(ZeroBubbleSchedule, SlotsAndStashesPerStageAsCountedByHand) {
  for (int pp = 1; pp <= 8; pp++) {
    for (int m = 1; m <= 32; m++) {
      for (int s = 0; s < pp; s++) {
        const auto ops = *make_schedule(ScheduleKind::kZbH1, pp, s, m, 1);
        const int warmup = std::min(pp - s - 1, m), d = std::min(s, m - warmup);
        EXPECT_EQ(peak_in_flight(ops, 0), std::min(pp - s, m)) << pp << " " << s << " " << m;
        EXPECT_EQ(peak_pending_weights(ops, 0), std::min(d + 1, m)) << pp << " " << s << " " << m;
      }
    }
    for (int s = 0; s < pp; s++) {
      const int m = 2 * pp + 3;
      const auto ops = *make_schedule(ScheduleKind::kZbV, pp, s, m, 2);
      EXPECT_EQ(peak_in_flight(ops, 0), 2 * pp - s) << "pp=" << pp << " s=" << s;
      EXPECT_EQ(peak_in_flight(ops, 1), s + 1) << "pp=" << pp << " s=" << s;
    }
  }
  const int want[4][2] = {{1, 1}, {2, 1}, {2, 2}, {2, 2}};
  for (int s = 0; s < 4; s++) {
    const auto ops = *make_schedule(ScheduleKind::kZbV, 4, s, 8, 2);
    EXPECT_EQ(peak_pending_weights(ops, 0), want[s][0]) << s;
    EXPECT_EQ(peak_pending_weights(ops, 1), want[s][1]) << s;
  }
  // The other schedules have no W.
  EXPECT_EQ(peak_pending_weights(*make_schedule(ScheduleKind::k1F1B, 4, 0, 8, 1), 0), 0);
}

TEST(ZeroBubbleSchedule, ZbH1ByHand) {
  // pp 4, stage 1, m 6: 2 warm-up forwards; the first B keeps its W; then
  // each B brings the oldest W; the cool-down's last W closes.
  std::string text;
  const std::vector<ScheduleOp> ops = make_schedule(ScheduleKind::kZbH1, 4, 1, 6, 1).value();
  for (const ScheduleOp& op : ops) {
    text += op.kind == OpKind::kForward ? 'F' : op.kind == OpKind::kBackward ? 'B' : 'W';
    text += std::to_string(op.micro) + " ";
  }
  EXPECT_EQ(text, "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5 ");
}

TEST(ZeroBubbleSchedule, ChoicesAndSizes) {
  EXPECT_EQ(*parse_schedule("zb-h1"), ScheduleKind::kZbH1);
  EXPECT_EQ(*parse_schedule("zbv"), ScheduleKind::kZbV);
  EXPECT_EQ(*parse_schedule("zb-auto"), ScheduleKind::kZbAuto);
  EXPECT_EQ(schedule_name(ScheduleKind::kZbAuto), "zb-auto");
  EXPECT_TRUE(splits_backward(ScheduleKind::kZbV));
  EXPECT_FALSE(splits_backward(ScheduleKind::kInterleaved1F1B));
  EXPECT_EQ(chunks_per_stage(ScheduleKind::kZbV, 1), 2);
  EXPECT_EQ(make_schedule(ScheduleKind::kZbV, 4, 0, 8, 3).status().message(),
            "--schedule zbv runs 2 model chunks per stage, not 3");
  EXPECT_EQ(make_schedule(ScheduleKind::kZbH1, 4, 0, 8, 2).status().message(),
            "--virtual-stages 2 needs --schedule interleaved");
}

}  // namespace
}  // namespace troupe::actors
