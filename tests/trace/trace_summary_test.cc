// The summary, critical path and failure analysis of hand-written traces
// whose expected figures are worked out by hand below.
#include <gtest/gtest.h>

#include "launcher/trace/failure.h"
#include "launcher/trace/messages.h"
#include "launcher/trace/summary.h"
#include "tests/trace/trace_test_util.h"

namespace troupe::launcher::trace {
namespace {
using namespace testing;  // NOLINT

// Two stages, 1F1B, m = 2, every op 10 ms, messages arrive as they are sent.
// Stage 0 runs F0 F1 B0 B1 (one warm-up forward), stage 1 F0 B0 F1 B1:
//   s0: F0 0-10  F1 10-20  .....  B0 30-40  .....  B1 50-60
//   s1: .....  F0 10-20  B0 20-30  F1 30-40  B1 40-50  .....
// (s1's F1 waits for s0's F1 at 20 but its stream is busy with B0 to 30;
// s0's B0 waits for s1's B0 gradient at 30.) The span is 0-60; each stage
// is busy 40 and idle 20: bubble 20/60 = 1/3 = (p-1)/(m+p-1).
std::vector<RankFile> two_stage_1f1b(std::int64_t offset1 = 0, std::int64_t uncertainty1 = 0) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2, .m = 2, .host = "h0"}, .events = {}};
  RankFile r1{.h = {.rank = 1,
                    .s = 1,
                    .pp = 2,
                    .m = 2,
                    .offset_ns = offset1,
                    .uncertainty_ns = uncertainty1,
                    .host = "h1"},
              .events = {}};
  r0.add(op("forward", 0, 10, 1, 0));
  r0.add(message("send", 10, 10, 1, 1, "activation", 0, "0xa0"));
  r0.add(op("forward", 10, 20, 1, 1));
  r0.add(message("send", 20, 20, 1, 1, "activation", 1, "0xa1"));
  r0.add(message("recv", 0, 30, 1, 1, "gradient", 0, "0xb0"));
  r0.add(op("backward", 30, 40, 1, 0));
  r0.add(message("recv", 0, 50, 1, 1, "gradient", 1, "0xb1"));
  r0.add(op("backward", 50, 60, 1, 1));
  r0.add(step_event(0, 60, 1));
  r1.add(message("recv", 0, 10, 1, 0, "activation", 0, "0xa0"));
  r1.add(op("forward", 10, 20, 1, 0));
  r1.add(message("recv", 0, 20, 1, 0, "activation", 1, "0xa1"));
  r1.add(op("backward", 20, 30, 1, 0));
  r1.add(message("send", 30, 30, 1, 0, "gradient", 0, "0xb0"));
  r1.add(op("forward", 30, 40, 1, 1));
  r1.add(op("backward", 40, 50, 1, 1));
  r1.add(message("send", 50, 50, 1, 0, "gradient", 1, "0xb1"));
  r1.add(step_event(0, 50, 1));
  return {r0, r1};
}

TEST(TraceSummary, TwoStage1F1BBusyIdleAndBubbleByHand) {
  Trace t = assemble(two_stage_1f1b());
  std::vector<Message> ms = match_messages(t);
  Summary s = summarize(t, ms, std::nullopt);
  ASSERT_EQ(s.steps, std::vector<int>{1});
  ASSERT_EQ(s.ranks.size(), 2u);
  for (const RankStats& r : s.ranks) {
    EXPECT_EQ(r.busy, ns(40)) << r.rank;
    EXPECT_EQ(r.idle, ns(20)) << r.rank;
    EXPECT_EQ(r.span, ns(60)) << r.rank;
    EXPECT_EQ(r.comm, 0) << r.rank;  // every message arrived as it was sent
    EXPECT_EQ(r.sent, 2);
    EXPECT_EQ(r.received, 2);
    EXPECT_EQ(r.bytes_sent, 2 * 4096);
  }
  EXPECT_NEAR(s.mean_bubble, 1.0 / 3, 1e-12);
  EXPECT_NEAR(s.theory, 1.0 / 3, 1e-12);
  EXPECT_EQ(s.theory_formula, "(p-1)/(m+p-1) = 1/3");
  EXPECT_EQ(s.matched, 4);
  EXPECT_EQ(s.unmatched, 0);
  EXPECT_NE(s.text().find(
                "bubble: measured 33.3% (mean over stages), theory (p-1)/(m+p-1) = 1/3 = 33.3%"),
            std::string::npos)
      << s.text();
}

// Walking back from s0's B1 (the last to end, at 60): its gradient arrived
// at 50, after its stream's B0 ended (40): the message, then s1's B1; that
// one's stream was busy up to its start (F1 to 40; the last stage has no
// gradient to wait for): F1; F1's activation came at 20 but B0 ran to 30:
// B0; B0 follows F0 on the stream (20); F0 (10-20) was released by the
// activation of mb 0 at 10, sent when s0's F0 ended; F0 is the first op.
TEST(TraceSummary, CriticalPathByHand) {
  Trace t = assemble(two_stage_1f1b());
  std::vector<PathStep> p = critical_path(t, match_messages(t), 1);
  std::vector<std::string> want = {
      "forward mb 0 on rank 0 (0,0,0) h0", "activation mb 0: rank 0 -> rank 1",
      "forward mb 0 on rank 1 (0,1,0) h1", "backward mb 0 on rank 1 (0,1,0) h1",
      "forward mb 1 on rank 1 (0,1,0) h1", "backward mb 1 on rank 1 (0,1,0) h1",
      "gradient mb 1: rank 1 -> rank 0",   "backward mb 1 on rank 0 (0,0,0) h0"};
  ASSERT_EQ(p.size(), want.size());
  std::int64_t ops = 0;
  for (std::size_t i = 0; i < p.size(); i++) {
    EXPECT_EQ(p[i].what, want[i]) << i;
    if (!p[i].message) ops += p[i].duration;
  }
  EXPECT_EQ(ops, ns(60));  // the path covers the whole span: no idle on it
}

// The same trace with rank 1's clock 5 s behind the coordinator's (its
// file's times are 5 s smaller, offset_ns says so): once aligned, the same
// figures; unaligned, rank 1's ops would lie 5 s before rank 0's.
TEST(TraceSummary, ClockOffsetsAreApplied) {
  Trace t = assemble(two_stage_1f1b(5'000'000'000, 20'000));
  EXPECT_EQ(t.uncertainty_ns(), 20'000);
  EXPECT_EQ(t.ranks[1].events[1].b, ns(10));  // rank 1's F0, on the coordinator's clock
  Summary s = summarize(t, match_messages(t), std::nullopt);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[1].busy, ns(40));
  EXPECT_EQ(s.ranks[1].idle, ns(20));
  EXPECT_NEAR(s.mean_bubble, 1.0 / 3, 1e-12);
}

// Rank 0's forward 0-10 sends at 10; the activation reaches rank 1 at 13
// (3 ms in flight) and its forward runs 13-23. Span 0-23: rank 1 is idle
// 0-13, of which 10-13 waits on a message already sent: comm 3 ms. Rank 0
// receives nothing: its idle 10-23 is no communication wait.
TEST(TraceSummary, CommunicationWaitIsIdleWhileAMessageIsInFlight) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2, .m = 1}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2, .m = 1}, .events = {}};
  r0.add(op("forward", 0, 10, 1, 0));
  r0.add(message("send", 10, 10, 1, 1, "activation", 0, "0x1"));
  r0.add(step_event(0, 10, 1));
  r1.add(message("recv", 0, 13, 1, 0, "activation", 0, "0x1"));
  r1.add(op("forward", 13, 23, 1, 0));
  r1.add(step_event(0, 23, 1));
  Trace t = assemble({r0, r1});
  Summary s = summarize(t, match_messages(t), std::nullopt);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[0].idle, ns(13));
  EXPECT_EQ(s.ranks[0].comm, 0);
  EXPECT_EQ(s.ranks[1].idle, ns(13));
  EXPECT_EQ(s.ranks[1].comm, ns(3));
}

// Three stages. Rank 1 runs F0 10-20, waits for the gradient of mb 0 (rank
// 2 sends it at 40: it was not sent before), B0 40-50, then F1 50-60. The
// activation of mb 1 left rank 0 at 12 and was taken by rank 1 at 50: in
// flight through all of rank 1's idle time 20-40, but rank 1 was waiting
// for the gradient then, not for it. Gaps before rank 1's ops: [0,10] (its
// input arrived at 10), [20,40] (input sent at 40), [50,50]: none waited on
// a message already sent: comm 0 of idle 30.
TEST(TraceSummary, MessageInFlightForALaterOpIsNoCommunicationWait) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 3, .m = 2}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 3, .m = 2}, .events = {}};
  RankFile r2{.h = {.rank = 2, .s = 2, .pp = 3, .m = 2}, .events = {}};
  r0.add(op("forward", 0, 10, 1, 0));
  r0.add(message("send", 10, 10, 1, 1, "activation", 0, "0xa0"));
  r0.add(op("forward", 10, 12, 1, 1));
  r0.add(message("send", 12, 50, 1, 1, "activation", 1, "0xa1"));
  r0.add(step_event(0, 12, 1));
  r1.add(message("recv", 0, 10, 1, 0, "activation", 0, "0xa0"));
  r1.add(op("forward", 10, 20, 1, 0));
  r1.add(message("send", 20, 20, 1, 2, "activation", 0, "0xa2"));
  r1.add(message("recv", 0, 40, 1, 2, "gradient", 0, "0xb0"));
  r1.add(op("backward", 40, 50, 1, 0));
  r1.add(message("recv", 45, 50, 1, 0, "activation", 1, "0xa1"));
  r1.add(op("forward", 50, 60, 1, 1));
  r1.add(step_event(0, 60, 1));
  r2.add(message("recv", 0, 20, 1, 1, "activation", 0, "0xa2"));
  r2.add(op("forward", 20, 30, 1, 0));
  r2.add(op("backward", 30, 40, 1, 0));
  r2.add(message("send", 40, 40, 1, 1, "gradient", 0, "0xb0"));
  r2.add(step_event(0, 40, 1));
  Trace t = assemble({r0, r1, r2});
  Summary s = summarize(t, match_messages(t), std::nullopt);
  ASSERT_EQ(s.ranks.size(), 3u);
  EXPECT_EQ(s.ranks[1].idle, ns(30));
  EXPECT_EQ(s.ranks[1].comm, 0);
}

// A step some rank did not finish, or whose start a ring overwrote, is
// skipped, and the summary says why.
TEST(TraceSummary, StepsCutByTheRingOrUnfinishedAreSkipped) {
  std::vector<RankFile> f = two_stage_1f1b();
  RankFile& r1 = f[1];
  r1.add(step_event(60, 70, 2));            // rank 0 has no step 2
  f[0].h.dropped = 5;                       // and its ring dropped events...
  json oldest = op("forward", 0, 0, 0, 0);  // the oldest kept event ends at -1 ms
  oldest["b"] = -ns(5);
  oldest["e"] = -ns(1);
  f[0].events.insert(f[0].events.begin(), oldest);
  Trace t = assemble(f);
  std::vector<std::string> skipped;
  EXPECT_EQ(complete_steps(t, &skipped), std::vector<int>{1});
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0], "step 2: no record of it on rank 0 (0,0,0) h0");
  // Step 1 began (0) before rank 0's oldest kept event ended (at 1 ms): cut.
  f[0].events[0] = op("forward", 0, 1, 0, 0);
  f[0].events[0]["b"] = 0;
  f[0].events[0]["e"] = ns(1);
  Trace cut = assemble(f);
  skipped.clear();
  EXPECT_TRUE(complete_steps(cut, &skipped).empty());
  EXPECT_EQ(skipped[0], "step 1: its start was overwritten in the ring of rank 0 (0,0,0) h0");
}

// A planted stall: rank 1 never began step 3. Rank 0 did its forward of
// mb 0, its send is still open (nobody took it), it waits for the gradient
// from rank 1 (an open receive and an open shard wait). Everything points
// at rank 1, which has nothing open in step 3: the likely stalled rank.
TEST(TraceFailure, RankThatNeverBeganTheStepIsNamed) {
  RankFile r0{.h = {.rank = 0,
                    .s = 0,
                    .pp = 2,
                    .m = 1,
                    .reason = "stall",
                    .message = "no progress for 1.0 s in step 3",
                    .host = "h0"},
              .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2, .m = 1, .reason = "stall", .host = "h1"},
              .events = {}};
  r0.add(op("forward", 0, 10, 2, 0));
  r0.add(op("backward", 20, 30, 2, 0));
  r0.add(step_event(0, 30, 2));
  r0.add(op("forward", 30, 40, 3, 0));
  r0.add(open_event(message("send", 40, 0, 3, 1, "activation", 0, "0xa3")));
  r0.add(open_event(message("recv", 30, 0, 3, 1, "gradient", 0, "0xb3")));
  r0.add(open_event({{"k", "wait"},
                     {"b", 40.0},
                     {"step", 3},
                     {"actor", "shard"},
                     {"what", "gradient"},
                     {"peer", 1},
                     {"mb", 0},
                     {"chunk", 0}}));
  r0.add(open_event(step_event(30, 0, 3)));
  r1.add(op("forward", 10, 15, 2, 0));
  r1.add(op("backward", 15, 20, 2, 0));
  r1.add(step_event(0, 20, 2));
  Trace t = assemble({r0, r1});
  FailureAnalysis a = analyze_failure(t, match_messages(t));
  ASSERT_TRUE(a.triggered);
  EXPECT_EQ(a.stalled, std::vector<int>{1});
  EXPECT_NE(a.text.find(
                "likely stalled: rank 1 (0,1,0) h1: has not begun step 3 (waited for by ranks 0)"),
            std::string::npos)
      << a.text;
  EXPECT_NE(a.text.find("rank 0 waits for rank 1: receive of gradient mb 0 of step 3 (tag 0xb3) "
                        "posted at 30.000 ms; rank 1 has not sent it"),
            std::string::npos)
      << a.text;
  EXPECT_NE(a.text.find("last completed: backward mb 0 of step 2, ended at 20.000 ms"),
            std::string::npos)
      << a.text;
  // The whole run, finished: nothing to analyze.
  Trace done = assemble(two_stage_1f1b());
  EXPECT_FALSE(analyze_failure(done, match_messages(done)).triggered);
}

// TP: rank 0 entered all-reduce #5 of step 4, rank 1 stopped after #4 and
// never began step 4: the collective's missing rank, and the stalled one.
TEST(TraceFailure, CollectiveSomeRanksNeverEnteredIsNamed) {
  RankFile r0{.h = {.rank = 0, .t = 0, .tp = 2, .m = 1, .reason = "stall"}, .events = {}};
  RankFile r1{.h = {.rank = 1, .t = 1, .tp = 2, .m = 1, .reason = "stall", .host = "h1"},
              .events = {}};
  auto coll = [](double b, double e, int step, int seq) {
    return json{
        {"k", "collective"},  {"b", b},        {"e", e},     {"step", step}, {"group", "tp"},
        {"op", "all_reduce"}, {"bytes", 1024}, {"seq", seq}, {"mb", 0},      {"chunk", 0}};
  };
  for (RankFile* r : {&r0, &r1}) {
    r->add(coll(1, 2, 3, 4));
    r->add(op("forward", 0, 3, 3, 0));
    r->add(step_event(0, 3, 3));
  }
  r0.add(open_event(coll(5, 0, 4, 5)));
  r0.add(open_event(op("forward", 4, 0, 4, 0)));
  Trace t = assemble({r0, r1});
  FailureAnalysis a = analyze_failure(t, match_messages(t));
  EXPECT_EQ(a.stalled, std::vector<int>{1});
  EXPECT_NE(a.text.find("not all ranks joined tp all_reduce #5 (step 4 mb 0): entered by ranks 0; "
                        "missing ranks 1 (rank 1's last: #4)"),
            std::string::npos)
      << a.text;
  EXPECT_NE(a.text.find("likely stalled: rank 1 (0,0,1) h1: has not begun step 4"),
            std::string::npos)
      << a.text;
}

// Ranks 0 and 1 each wait for the other (open receives, both inside step
// 2): no rank is where the waits end; the cycle is named. An optimizer's
// wait for another replica's gradient pieces counts only when no shard
// waits: rank 2's optimizer waits for rank 3, which began nothing.
TEST(TraceFailure, CycleAndOptimizerOnlyWaits) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2, .reason = "stall"}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2, .reason = "stall"}, .events = {}};
  r0.add(open_event(message("recv", 1, 0, 2, 1, "gradient", 0, "0xb")));
  r0.add(open_event(step_event(0, 0, 2)));
  r1.add(open_event(message("recv", 1, 0, 2, 0, "activation", 0, "0xa")));
  r1.add(open_event(step_event(0, 0, 2)));
  Trace t = assemble({r0, r1});
  FailureAnalysis a = analyze_failure(t, match_messages(t));
  EXPECT_TRUE(a.stalled.empty());
  EXPECT_NE(a.text.find("likely stalled: a wait-for cycle: every rank waited for (0, 1) itself "
                        "waits for another"),
            std::string::npos)
      << a.text;

  RankFile o0{.h = {.rank = 0, .d = 0, .dp = 2, .reason = "stall"}, .events = {}};
  RankFile o1{.h = {.rank = 1, .d = 1, .dp = 2, .reason = "stall", .host = "h1"}, .events = {}};
  o0.add(open_event(message("recv", 1, 0, 2, 1, "grad-piece", 0, "0xc")));
  o0.add(open_event({{"k", "wait"},
                     {"b", 1.0},
                     {"step", 2},
                     {"actor", "optimizer"},
                     {"what", "gradients"},
                     {"peer", -1},
                     {"mb", -1},
                     {"chunk", 0}}));
  Trace opt = assemble({o0, o1});
  a = analyze_failure(opt, match_messages(opt));
  EXPECT_EQ(a.stalled, std::vector<int>{1});
  EXPECT_NE(a.text.find("likely stalled: rank 1 (1,0,0) h1: has not begun step 2"),
            std::string::npos)
      << a.text;
}

// dp = 2, pp = 2 (ranks 0, 1 stage 0; 2, 3 stage 1). Rank 0's shard waits
// for rank 2's gradient; ranks 2's and 3's optimizers wait for each other's
// gradient pieces (ZeRO partitions: they follow the shards). The shards'
// waits end at rank 2, which never began the step: it is named, not the
// optimizers' cycle.
TEST(TraceFailure, ShardWaitsComeBeforeOptimizerCycles) {
  std::vector<RankFile> f;
  for (int r = 0; r < 4; r++) {
    f.push_back({.h = {.rank = r, .d = r % 2, .s = r / 2, .pp = 2, .dp = 2, .reason = "stall"},
                 .events = {}});
  }
  f[0].add(open_event(message("recv", 1, 0, 2, 2, "gradient", 0, "0xb")));
  f[0].add(open_event(step_event(0, 0, 2)));
  f[2].add(open_event(message("recv", 1, 0, 2, 3, "grad-piece", 0, "0xc")));
  f[3].add(open_event(message("recv", 1, 0, 2, 2, "grad-piece", 0, "0xd")));
  Trace t = assemble(f);
  FailureAnalysis a = analyze_failure(t, match_messages(t));
  EXPECT_EQ(a.stalled, std::vector<int>{2}) << a.text;
}

TEST(TraceSummary, IntervalArithmetic) {
  EXPECT_EQ(union_of({{5, 7}, {0, 2}, {1, 3}, {7, 8}}), (std::vector<Interval>{{0, 3}, {5, 8}}));
  EXPECT_EQ(length({{0, 3}, {5, 8}}), 6);
  EXPECT_EQ(overlap({{0, 3}, {5, 8}}, {{2, 6}}), 2);
}

}  // namespace
}  // namespace troupe::launcher::trace

namespace troupe::launcher::trace::testing {
namespace {

// A stream stuck in an op (a hung kernel, an op slower than the watchdog):
// rank 0 is inside forward mb 1 of step 2, and its actor, having run ahead,
// already waits for the gradient of mb 0 from rank 1, which waits for the
// activation of mb 1 from rank 0. Not a cycle: rank 0's op is where the
// waits end (its inputs had all arrived when it began).
TEST(TraceFailure, ARankStuckInsideAnOpIsNamedNotACycle) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2, .m = 2, .reason = "stall", .host = "h0"},
              .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2, .m = 2, .reason = "stall", .host = "h1"},
              .events = {}};
  r0.add(op("forward", 0, 10, 2, 0));
  r0.add(message("send", 10, 11, 2, 1, "activation", 0, "0xa0"));
  r0.add(open_event(op("forward", 10, 0, 2, 1)));
  r0.add(open_event(message("recv", 10.5, 0, 2, 1, "gradient", 0, "0xb0")));
  r0.add(open_event({{"k", "wait"},
                     {"b", 10.5},
                     {"step", 2},
                     {"actor", "shard"},
                     {"what", "gradient"},
                     {"peer", 1},
                     {"mb", 0},
                     {"chunk", 0}}));
  r0.add(open_event(step_event(0, 0, 2)));
  r1.add(message("recv", 0, 11, 2, 0, "activation", 0, "0xa0"));
  r1.add(op("forward", 11, 15, 2, 0));
  r1.add(op("backward", 15, 20, 2, 0));
  r1.add(message("send", 20, 21, 2, 0, "gradient", 0, "0xb0"));
  r1.add(open_event(message("recv", 20, 0, 2, 0, "activation", 1, "0xa1")));
  r1.add(open_event({{"k", "wait"},
                     {"b", 20.0},
                     {"step", 2},
                     {"actor", "shard"},
                     {"what", "activation"},
                     {"peer", 0},
                     {"mb", 1},
                     {"chunk", 0}}));
  r1.add(open_event(step_event(0, 0, 2)));
  Trace t = assemble({r0, r1});
  FailureAnalysis a = analyze_failure(t, match_messages(t));
  EXPECT_EQ(a.stalled, std::vector<int>{0}) << a.text;
  EXPECT_NE(a.text.find("likely stalled: rank 0 (0,0,0) h0: is still in forward mb 1 of step 2"),
            std::string::npos)
      << a.text;
  EXPECT_EQ(a.text.find("cycle"), std::string::npos) << a.text;
}

// A tag repeats (an evaluation reuses its step's activation tags) and the
// receiver's ring dropped its oldest events: the sends without a partner
// are the oldest, not the newest, so each newer send keeps its own receive.
TEST(TraceMessages, WhenTheReceiverDroppedEventsTheOldestSendsAreTheUnmatchedOnes) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2, .dropped = 5}, .events = {}};
  r0.add(message("send", 1, 2, 1, 1, "activation", 0, "0x7"));
  r0.add(message("send", 10, 11, 1, 1, "activation", 0, "0x7"));
  r0.add(message("send", 20, 21, 1, 1, "activation", 0, "0x7"));
  r1.add(message("recv", 9, 11, 1, 0, "activation", 0, "0x7"));
  r1.add(message("recv", 19, 21, 1, 0, "activation", 0, "0x7"));
  Trace t = assemble({r0, r1});
  std::vector<Message> ms = match_messages(t);
  ASSERT_EQ(ms.size(), 3u);
  ASSERT_TRUE(ms[0].matched() && ms[1].matched());
  EXPECT_EQ(event_of(t, *ms[0].send).b, ns(10));
  EXPECT_EQ(event_of(t, *ms[0].recv).e, ns(11));
  EXPECT_EQ(event_of(t, *ms[1].send).b, ns(20));
  EXPECT_EQ(event_of(t, *ms[1].recv).e, ns(21));
  EXPECT_FALSE(ms[2].matched());
  EXPECT_EQ(event_of(t, *ms[2].send).b, ns(1));
  // Nothing dropped: the newest send is the one whose receive is not posted yet.
  RankFile q1{.h = {.rank = 1, .s = 1, .pp = 2}, .events = {}};
  q1.add(message("recv", 0, 2, 1, 0, "activation", 0, "0x7"));
  q1.add(message("recv", 9, 11, 1, 0, "activation", 0, "0x7"));
  Trace u = assemble({r0, q1});
  std::vector<Message> us = match_messages(u);
  ASSERT_EQ(us.size(), 3u);
  EXPECT_EQ(event_of(u, *us[0].send).b, ns(1));
  EXPECT_EQ(event_of(u, *us[1].send).b, ns(10));
  EXPECT_FALSE(us[2].matched());
  EXPECT_EQ(event_of(u, *us[2].send).b, ns(20));
}

TEST(TraceFiles, AbsurdLayoutSizesAreAnError) {
  RankFile f{.h = {.rank = 0, .v = 1 << 30, .m = 4}, .events = {}};
  absl::StatusOr<RankTrace> r = parse_rank_file("rank-00000.trace.jsonl", f.text());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank-00000.trace.jsonl"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace troupe::launcher::trace::testing
