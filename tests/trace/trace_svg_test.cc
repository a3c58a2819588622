// The SVG pictures on their own (launcher/trace/svg.h: no trace involved, as the
// planner will use them) and the interleaved schedule's theory.
#include <gtest/gtest.h>

#include "launcher/trace/summary.h"
#include "launcher/trace/svg.h"
#include "tests/trace/trace_test_util.h"

namespace troupe::launcher::trace {
namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) n++;
  return n;
}

// Ticks of [0, 330] about 10 apart: 330/10 = 33, so the next of 10, 20, 50
// is 50: 0, 50, ..., 300. Of [0.2, 1.1] by 5: 0.18 -> 0.2: 0.2, ..., 1.0.
TEST(TraceSvg, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 330, 10), (std::vector<double>{0, 50, 100, 150, 200, 250, 300}));
  std::vector<double> t = nice_ticks(0.2, 1.1, 5);
  ASSERT_EQ(t.size(), 5u);
  for (std::size_t i = 0; i < t.size(); i++) EXPECT_NEAR(t[i], 0.2 * (i + 1), 1e-12);
}

// Two rows, a forward and a backward of chunk 0 and a forward of chunk 1:
// three blocks with their tooltips, the wide ones labelled, one too narrow
// for its label (0.01 of 40 time units on ~1200 px: 0.3 px); the arrow and
// the legend's; chunk 1 in a lighter blue than chunk 0's.
TEST(TraceSvg, ScheduleFromBlocksAndArrows) {
  ScheduleSvg s;
  s.title = "a <test> step";
  s.rows = {"stage 0", "stage 1"};
  s.chunks = 2;
  s.blocks = {{0, 0, 10, Pass::kForward, 0, "1", "f1"},
              {1, 10, 30, Pass::kBackward, 0, "1", "b1"},
              {0, 39.99, 40, Pass::kForward, 1, "17", "f17"}};
  s.arrows = {{0, 10, 1, 10.5, Pass::kForward}};
  const std::string svg = render_schedule_svg(s);
  EXPECT_EQ(count(svg, "<g><title>"), 3);
  EXPECT_EQ(count(svg, "marker-end=\"url(#arrow)\""), 2);
  EXPECT_NE(svg.find(">1</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">17</text>"), std::string::npos);
  EXPECT_NE(svg.find("a &lt;test&gt; step"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#2f62b2\""), std::string::npos);  // forward, chunk 0
  // chunk 1 of 2: 55% of the way to white: 47 + 0.55 * 208 = 161 (a1), 98 + 0.55 * 157 = 184
  // (b8), 178 + 0.55 * 77 = 220 (dc)
  EXPECT_NE(svg.find("fill=\"#a1b8dc\""), std::string::npos);
  EXPECT_NE(svg.find("forward, chunk 1"), std::string::npos);
  EXPECT_NE(svg.find("time (ms)"), std::string::npos);
}

TEST(TraceSvg, PlotWithoutPointsSaysSo) {
  EXPECT_NE(render_plot_svg({"loss", "step", "loss", {}, {}}).find("no data"), std::string::npos);
  const std::string p = render_plot_svg({"loss", "step", "loss", {1, 2, 3}, {3, 2, 1}});
  EXPECT_EQ(count(p, "<circle"), 3);
}

// Interleaved, p = 2, v = 2, m = 2: (p-1)/(v*m+p-1) = 1/5.
TEST(TraceSummary, InterleavedTheory) {
  using testing::RankFile;
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2, .v = 2, .schedule = "interleaved", .m = 2},
              .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2, .v = 2, .schedule = "interleaved", .m = 2},
              .events = {}};
  for (RankFile* r : {&r0, &r1}) {
    r->add(testing::op("forward", 0, 10, 1, 0));
    r->add(testing::step_event(0, 10, 1));
  }
  Trace t = testing::assemble({r0, r1});
  Summary s = summarize(t, match_messages(t), std::nullopt);
  EXPECT_EQ(s.theory_formula, "(p-1)/(v*m+p-1) = 1/5");
  EXPECT_DOUBLE_EQ(s.theory, 0.2);
}

}  // namespace
}  // namespace troupe::launcher::trace
