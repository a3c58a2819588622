// Hang diagnosis (actors/diagnostics/stall_analysis.h): hand-built sets of WaitReports,
// each with its culprit worked out by hand from the wait-for graph drawn in
// the comment above the test.
#include "actors/diagnostics/stall_analysis.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace troupe::actors {
namespace {

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The line of `text` that contains `part` ("" when none does).
std::string line_with(const std::string& text, const std::string& part) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (has(line, part)) return line;
  }
  return "";
}

// Every rank's shard and optimizer of `layout`, in `step`, waiting for
// nothing: the tests make some of them wait.
std::vector<WaitReport> idle(const comm::Layout& layout, int step) {
  std::vector<WaitReport> reports;
  for (int rank = 0; rank < layout.world(); rank++) {
    const comm::Coord c = layout.coord(rank);
    for (const char* kind : {"shard", "optimizer"}) {
      WaitReport r;
      r.rank = rank;
      r.actor = std::string(kind) + " d=" + std::to_string(c.d) + " s=" + std::to_string(c.s);
      r.step = step;
      reports.push_back(r);
    }
  }
  return reports;
}

WaitReport& shard(std::vector<WaitReport>& reports, int rank) {
  return reports[static_cast<std::size_t>(2 * rank)];
}
WaitReport& optimizer(std::vector<WaitReport>& reports, int rank) {
  return reports[static_cast<std::size_t>(2 * rank + 1)];
}

// A shard at schedule op `op_id` that waits for an activation or gradient.
void waits_at_op(WaitReport& r, int op_id, const std::string& op, const std::string& what, int peer,
                 double since) {
  r.op_id = op_id;
  r.op = op;
  r.waiting = what;
  r.peer = peer;
  r.since_s = since;
}

// analyze_stall on a StallInput of these fields (no ready shard, no hosts
// unless given).
StallAnalysis analyze(std::vector<WaitReport> reports, const comm::Layout& layout, int step,
                      std::vector<bool> ready = {}, std::vector<std::string> hosts = {}) {
  StallInput in;
  in.reports = std::move(reports);
  in.layout = layout;
  in.step = step;
  in.ready = std::move(ready);
  in.hosts = std::move(hosts);
  return analyze_stall(in);
}

std::vector<int> culprit_ranks(const StallAnalysis& a, std::size_t k) {
  return k < a.culprits.size() ? a.culprits[k].ranks : std::vector<int>{};
}

// tp=1 pp=2 dp=2: ranks 0 (0,0,0), 1 (1,0,0), 2 (0,1,0), 3 (1,1,0).
const comm::Layout kPp2Dp2{.tp = 1, .pp = 2, .dp = 2};

// 0 -> 1 -> 3, and 3 has not begun step 2 (its step is still 1): 3 is where
// every wait ends. Rank 2 is in the step and waits for nothing: no row.
std::vector<WaitReport> chain() {
  std::vector<WaitReport> r = idle(kPp2Dp2, 2);
  waits_at_op(shard(r, 0), 3, "forward of micro-batch 1 (chunk 0)", "the gradient from rank 1", 1,
              2.0);
  waits_at_op(shard(r, 1), 2, "backward of micro-batch 0 (chunk 0)", "the gradient from rank 3", 3,
              1.5);
  shard(r, 3).step = 1;
  shard(r, 3).since_s = 3.0;
  return r;
}

TEST(StallAnalysis, AChainEndsAtTheShardThatHasNotBegun) {
  const StallAnalysis a = analyze(chain(), kPp2Dp2, 2);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(a.culprits[0].ranks, std::vector<int>{3});
  EXPECT_FALSE(a.culprits[0].cycle);
  EXPECT_EQ(a.culprits[0].text, "likely culprit: rank 3 (d=1 s=1 t=0): has not begun step 2");
  // Columns aligned by hand: each column as wide as its widest cell, two
  // spaces between columns.
  // clang-format off
  EXPECT_EQ(a.table,
            "  rank  (d,s,t)  actor          op / micro-batch                     waiting for               from            since\n"
            "  0     (0,0,0)  shard d=0 s=0  forward of micro-batch 1 (chunk 0)   the gradient from rank 1  rank 1 (1,0,0)  2.0 s\n"
            "  1     (1,0,0)  shard d=1 s=0  backward of micro-batch 0 (chunk 0)  the gradient from rank 3  rank 3 (1,1,0)  1.5 s\n"
            "  3     (1,1,0)  shard d=1 s=1  -                                    has not begun step 2      -               3.0 s");
  // clang-format on
  EXPECT_EQ(a.text(), "\n" + a.table + "\n  " + a.culprits[0].text);
}

TEST(StallAnalysis, HostsNameWhereTheCulpritRuns) {
  const StallAnalysis a = analyze(chain(), kPp2Dp2, 2, {}, {"h1", "h1", "h2", "h2"});
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(a.culprits[0].text,
            "likely culprit: rank 3 (d=1 s=1 t=0) on host h2: has not begun step 2");
  EXPECT_TRUE(has(a.table, "  rank  (d,s,t)  host  actor  ")) << a.table;
  EXPECT_TRUE(has(a.table, "  3     (1,1,0)  h2    shard d=1 s=1  -  ")) << a.table;
  // Without hosts there is no host column and no "on host".
  const StallAnalysis b = analyze(chain(), kPp2Dp2, 2);
  EXPECT_FALSE(has(b.table, "host")) << b.table;
  EXPECT_FALSE(has(b.text(), "on host")) << b.text();
}

// 0 -> 2 and 1 -> 3 -> 2; rank 2 is in the step and waits for no one: both
// chains end there, and its direct waiters are 0 and 3.
TEST(StallAnalysis, TwoChainsEndAtOneSinkThatWaitsForNoOne) {
  std::vector<WaitReport> r = idle(kPp2Dp2, 2);
  waits_at_op(shard(r, 0), 1, "backward of micro-batch 0 (chunk 0)", "the gradient from rank 2", 2,
              1);
  waits_at_op(shard(r, 1), 1, "backward of micro-batch 0 (chunk 0)", "the gradient from rank 3", 3,
              1);
  waits_at_op(shard(r, 3), 1, "forward of micro-batch 0 (chunk 0)", "the activation from rank 2", 2,
              1);
  const StallAnalysis a = analyze(r, kPp2Dp2, 2);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(a.culprits[0].ranks, std::vector<int>{2});
  EXPECT_EQ(a.culprits[0].text,
            "likely culprit: rank 2 (d=0 s=1 t=0): not waiting for anyone, but ranks 0, 3 wait "
            "for it");
}

// 0 -> 1 -> 2 -> 1: the cycle {1, 2} has no way out; 0 only leads into it.
TEST(StallAnalysis, ACycleWithNoExitIsReportedAsACycle) {
  std::vector<WaitReport> r = idle(kPp2Dp2, 2);
  waits_at_op(shard(r, 0), 1, "op", "the gradient from rank 1", 1, 1);
  waits_at_op(shard(r, 1), 1, "op", "the gradient from rank 2", 2, 1);
  waits_at_op(shard(r, 2), 1, "op", "the activation from rank 1", 1, 1);
  const StallAnalysis a = analyze(r, kPp2Dp2, 2);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_TRUE(a.culprits[0].cycle);
  EXPECT_EQ(a.culprits[0].ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(a.culprits[0].text, "likely culprit: wait-for cycle: rank 1 -> rank 2 -> rank 1");
  // The same cycle with an exit (2 also waits on 3, which has not begun) is
  // not where the waits end: 3 is.
  waits_at_op(optimizer(r, 2), -1, "", "the gradients of step 2", 3, 1);
  shard(r, 3).step = 1;
  const StallAnalysis b = analyze(r, kPp2Dp2, 2);
  ASSERT_EQ(b.culprits.size(), 1u) << b.text();
  EXPECT_FALSE(b.culprits[0].cycle);
  EXPECT_EQ(b.culprits[0].ranks, std::vector<int>{3});
}

// pp=4: 1 -> 2 -> 3 -> 1 and 2 -> 1: the shortest cycle through the
// smallest rank is 1 -> 2 -> 1, and rank 3 is caught in the same knot.
TEST(StallAnalysis, AKnotOfThreeRanksNamesItsShortestCycle) {
  const comm::Layout pp4{.tp = 1, .pp = 4, .dp = 1};
  std::vector<WaitReport> r = idle(pp4, 5);
  waits_at_op(shard(r, 1), 1, "op", "x", 2, 1);
  waits_at_op(shard(r, 2), 1, "op", "x", 3, 1);
  waits_at_op(optimizer(r, 2), -1, "", "y", 1, 1);
  waits_at_op(shard(r, 3), 1, "op", "x", 1, 1);
  const StallAnalysis a = analyze(r, pp4, 5);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_TRUE(a.culprits[0].cycle);
  EXPECT_EQ(a.culprits[0].text,
            "likely culprit: wait-for cycle: rank 1 -> rank 2 -> rank 1 (3 ranks wait on each "
            "other)");
}

TEST(StallAnalysis, NobodyWaitingReportsNothing) {
  const StallAnalysis a = analyze(idle(kPp2Dp2, 2), kPp2Dp2, 2);
  EXPECT_TRUE(a.culprits.empty());
  EXPECT_EQ(a.table, "");
  EXPECT_EQ(a.text(), " (nothing reported)");
}

// pp=1 dp=2, step 3. Rank 0's shard is past its schedule (waits for its new
// parameters, peer -1) and its optimizer waits for gradients (peer -1);
// rank 1's shard has not begun. The optimizer of rank 0 sums the gradients
// of data group {0, 1}; shard 1 has not sent them, so 0 -> 1, and rank 0
// is not a culprit of its own: only rank 1 is.
TEST(StallAnalysis, AnOptimizerWaitsOnTheShardsThatOweItGradients) {
  const comm::Layout dp2{.tp = 1, .pp = 1, .dp = 2};
  std::vector<WaitReport> r = idle(dp2, 3);
  waits_at_op(shard(r, 0), -1, "", "the new parameters from the optimizer partitions", -1, 4);
  waits_at_op(optimizer(r, 0), -1, "", "the gradients of step 3 (2 pieces)", -1, 4);
  shard(r, 1).step = 2;
  const StallAnalysis a = analyze(r, dp2, 3);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(a.culprits[0].text, "likely culprit: rank 1 (d=1 s=0 t=0): has not begun step 3");
  EXPECT_TRUE(has(line_with(a.table, "the gradients of step 3"), "rank 1 (1,0,0)")) << a.table;
}

// pp=2 dp=1: the stage-0 optimizer also sums the tied wte's gradient from
// the head stage (rank 1), whose shard is still at an op waiting for a free
// activation slot (local: no rank named). 0 -> 1; rank 1 waits on no known
// rank, so it is the culprit, with what it waits for.
TEST(StallAnalysis, TheEmbeddingOptimizerWaitsOnTheHeadStage) {
  const comm::Layout pp2{.tp = 1, .pp = 2, .dp = 1};
  std::vector<WaitReport> r = idle(pp2, 2);
  waits_at_op(shard(r, 0), -1, "", "the new parameters from the optimizer partitions", -1, 4);
  waits_at_op(optimizer(r, 0), -1, "", "the gradients of step 2 (5 pieces)", -1, 4);
  waits_at_op(shard(r, 1), 6, "forward of micro-batch 2 (chunk 0)",
              "a free activation slot (all 2 in use)", -1, 4);
  const StallAnalysis a = analyze(r, pp2, 2);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(a.culprits[0].text,
            "likely culprit: rank 1 (d=0 s=1 t=0): its shard d=0 s=1 waits for a free activation "
            "slot (all 2 in use), from no known rank");
}

// pp=1 dp=2: rank 1's shard is done (ready; its step is back to 0) and its
// optimizer waits for the clip factor; rank 0's shard waits for its new
// parameters, which partition 1 (still waiting) has not sent: 0 -> 1. The
// ready shard has begun: without `ready` it would read as not begun.
TEST(StallAnalysis, AShardThatIsReadyHasBegun) {
  const comm::Layout dp2{.tp = 1, .pp = 1, .dp = 2};
  std::vector<WaitReport> r = idle(dp2, 4);
  waits_at_op(shard(r, 0), -1, "", "the new parameters from the optimizer partitions", -1, 2);
  waits_at_op(optimizer(r, 1), -1, "", "the clip factor from the coordinator", -1, 2);
  shard(r, 1).step = 0;
  const StallAnalysis a = analyze(r, dp2, 4, {false, true});
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(a.culprits[0].text,
            "likely culprit: rank 1 (d=1 s=0 t=0): its optimizer d=1 s=0 waits for the clip "
            "factor from the coordinator, from no known rank");
  EXPECT_FALSE(has(a.text(), "has not begun")) << a.text();
}

// `rank` still in its update of `step`: its shard waits for the new
// parameters, its optimizer is in AdamW (2 s each).
void still_updating(std::vector<WaitReport>& r, int rank, int step) {
  shard(r, rank).waiting = "the new parameters";
  shard(r, rank).since_s = 2.0;
  optimizer(r, rank).waiting = absl::StrCat("AdamW of step ", step);
  optimizer(r, rank).since_s = 2.0;
}

// pp=2 dp=1, step 5: rank 0 is ready and has begun step 6, which came with
// step 5's update (its shard waits for step 6's gradient, its optimizer for
// step 6's gradients); rank 1 waits for its new parameters and its
// optimizer is still in AdamW of step 5. Rank 0's actors one step on have
// begun, not "not begun"; the waits of step 5 end at rank 1.
TEST(StallAnalysis, AReadyRankInTheNextStepHasBegun) {
  const comm::Layout pp2{.tp = 1, .pp = 2, .dp = 1};
  std::vector<WaitReport> r = idle(pp2, 5);
  shard(r, 0).step = 6;
  waits_at_op(shard(r, 0), 1, "backward of micro-batch 0 (chunk 0)", "the gradient from rank 1", 1,
              1.0);
  optimizer(r, 0).step = 6;
  optimizer(r, 0).waiting = "the gradients of step 6 (1 pieces)";
  still_updating(r, 1, 5);
  const StallAnalysis a = analyze(r, pp2, 5, {true, false});
  EXPECT_FALSE(has(a.text(), "has not begun")) << a.text();
  EXPECT_FALSE(has(a.table, "step 6")) << a.table;
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(culprit_ranks(a, 0), std::vector<int>{1}) << a.text();
}

// tp=2 pp=1 dp=1, step 5: rank 0 is ready and in step 6, where its forward
// waits inside the TP all-reduce for rank 1 (its stream has not finished
// that op); rank 1 is still in step 5, its optimizer in AdamW. An op of the
// next step holds up nothing in this one: rank 1 is the culprit, not rank
// 0's stream.
TEST(StallAnalysis, AReadyRanksOpOfTheNextStepIsNotACulprit) {
  const comm::Layout tp2{.tp = 2, .pp = 1, .dp = 1};
  std::vector<WaitReport> r = idle(tp2, 5);
  shard(r, 0).step = 6;
  shard(r, 0).computing = "forward of micro-batch 0 (chunk 0)";
  optimizer(r, 0).step = 6;
  still_updating(r, 1, 5);
  const StallAnalysis a = analyze(r, tp2, 5, {true, false});
  EXPECT_FALSE(has(a.text(), "stream has not finished")) << a.text();
  for (const Culprit& c : a.culprits) {
    EXPECT_NE(c.ranks, std::vector<int>{0}) << a.text();
  }
}

// An actor that did not answer is where the waits on its rank end.
TEST(StallAnalysis, AShardThatDidNotAnswerIsARootCause) {
  std::vector<WaitReport> r = chain();
  r.erase(r.begin() + 2 * 3);  // shard(r, 3): no report
  const StallAnalysis a = analyze(r, kPp2Dp2, 2);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_EQ(a.culprits[0].text, "likely culprit: rank 3 (d=1 s=1 t=0): its shard did not answer");
  EXPECT_TRUE(has(a.table, "(did not answer)")) << a.table;
  // Neither of rank 3's actors answers: a row for each, named by its kind.
  r.erase(r.begin() + 2 * 3);  // now optimizer(r, 3)
  const StallAnalysis b = analyze(r, kPp2Dp2, 2);
  ASSERT_EQ(b.culprits.size(), 1u) << b.text();
  EXPECT_EQ(b.culprits[0].text,
            "likely culprit: rank 3 (d=1 s=1 t=0): its shard did not answer; its optimizer did not "
            "answer");
  EXPECT_TRUE(has(line_with(b.table, "optimizer"), "(did not answer)")) << b.table;
}

// The stage_stalls CLI case by hand (pp=2 dp=2, stage 1 never begins step
// 2): both stage-1 ranks are culprits, and the stage-0 optimizers, waiting
// for gradients, lead to them too.
TEST(StallAnalysis, EveryStageThatHasNotBegunIsNamed) {
  std::vector<WaitReport> r = idle(kPp2Dp2, 2);
  waits_at_op(shard(r, 0), 4, "backward of micro-batch 0 (chunk 0)", "the gradient from rank 2", 2,
              1);
  waits_at_op(shard(r, 1), 4, "backward of micro-batch 0 (chunk 0)", "the gradient from rank 3", 3,
              1);
  for (int k = 0; k < 4; k++) {
    waits_at_op(optimizer(r, k), -1, "", "the gradients of step 2 (9 pieces)", -1, 1);
  }
  shard(r, 2).step = shard(r, 3).step = 1;
  const StallAnalysis a = analyze(r, kPp2Dp2, 2);
  ASSERT_EQ(a.culprits.size(), 2u) << a.text();
  EXPECT_EQ(culprit_ranks(a, 0), std::vector<int>{2});
  EXPECT_EQ(culprit_ranks(a, 1), std::vector<int>{3});
  EXPECT_TRUE(has(a.culprits[1].text, "rank 3 (d=1 s=1 t=0): has not begun step 2"))
      << a.culprits[1].text;
}

// A chain across 5000 ranks (pp = 5000, rank r waits on r + 1) ends at the
// last: the graph walks must not recurse per rank.
TEST(StallAnalysis, ALongChainDoesNotRecurse) {
  const comm::Layout pp{.tp = 1, .pp = 5000, .dp = 1};
  std::vector<WaitReport> r = idle(pp, 1);
  for (int k = 0; k + 1 < pp.world(); k++) waits_at_op(shard(r, k), 0, "op", "x", k + 1, 1);
  const StallAnalysis a = analyze(r, pp, 1);
  ASSERT_EQ(a.culprits.size(), 1u);
  EXPECT_EQ(a.culprits[0].ranks, std::vector<int>{4999});
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

// tp=1 pp=2 dp=1: rank 0's stream is inside forward mb 1 and has not
// finished it (an op slower than the timeout, a hung kernel); its actor,
// ahead of the stream, already waits for mb 0's gradient from rank 1,
// which waits for mb 1's activation from rank 0. Not a cycle: rank 0.
TEST(StallAnalysis, AStreamThatHasNotFinishedItsOpIsTheCulpritNotACycle) {
  const comm::Layout pp2{.tp = 1, .pp = 2, .dp = 1};
  std::vector<WaitReport> r = idle(pp2, 2);
  waits_at_op(shard(r, 0), 3, "backward of micro-batch 0 (chunk 0)", "the gradient from rank 1", 1,
              2.0);
  shard(r, 0).computing = "forward of micro-batch 1 (chunk 0)";
  waits_at_op(shard(r, 1), 2, "forward of micro-batch 1 (chunk 0)", "the activation from rank 0", 0,
              2.0);
  const StallAnalysis a = analyze(r, pp2, 2);
  ASSERT_EQ(a.culprits.size(), 1u) << a.text();
  EXPECT_FALSE(a.culprits[0].cycle) << a.text();
  EXPECT_EQ(a.culprits[0].text,
            "likely culprit: rank 0 (d=0 s=0 t=0): its stream has not finished the forward of "
            "micro-batch 1 (chunk 0)");
  // With a TP peer that has not begun the step, the op waits for it there.
  const comm::Layout tp2{.tp = 2, .pp = 1, .dp = 1};
  std::vector<WaitReport> q = idle(tp2, 2);
  shard(q, 0).computing = "forward of micro-batch 0 (chunk 0)";
  shard(q, 1).step = 1;
  const StallAnalysis b = analyze(q, tp2, 2);
  ASSERT_EQ(b.culprits.size(), 1u) << b.text();
  EXPECT_EQ(b.culprits[0].ranks, std::vector<int>{1}) << b.text();
}

}  // namespace
}  // namespace troupe::actors
