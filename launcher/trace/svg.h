// SVG pictures, on their own: a pipeline schedule drawn as the Megatron
// paper's figures are (a row per rank, time to the right, forward and
// backward blocks in two colors, model chunks in shades of them, each block
// labelled with its micro-batch, idle time as gaps, arrows for messages),
// and line plots with axes. They know nothing of traces: the caller turns
// measured (launcher/trace/html.h) or simulated steps into blocks and arrows.
//
//   trace::ScheduleSvg s;
//   s.rows = {"stage 0", "stage 1"};
//   s.chunks = 1;
//   s.blocks.push_back({.row = 0, .begin = 0, .end = 10, .pass = trace::Pass::kForward, .label =
//   "1"}); s.arrows.push_back({.from_row = 0, .from = 10, .to_row = 1, .to = 10.2}); std::string
//   svg = trace::render_schedule_svg(s);
#pragma once

#include <string>
#include <vector>

namespace troupe::launcher::trace {

// kWeight: a zero-bubble schedule's W (the weight gradients alone); its
// kBackward is then B, the input gradient.
enum class Pass { kForward, kBackward, kWeight };

struct Block {
  int row = 0;
  double begin = 0, end = 0;  // in the drawing's time unit (ms for traces)
  Pass pass = Pass::kForward;
  int chunk = 0;        // model chunk: a shade of the pass's color
  std::string label;    // drawn inside when it fits ("3")
  std::string tooltip;  // the SVG <title>
};

struct Arrow {
  int from_row = 0;
  double from = 0;
  int to_row = 0;
  double to = 0;
  Pass pass = Pass::kForward;  // an activation (forward) or a gradient (backward)
};

struct ScheduleSvg {
  std::string title;
  std::vector<std::string> rows;  // top to bottom
  std::vector<Block> blocks;
  std::vector<Arrow> arrows;
  int chunks = 1;  // model chunks per rank (shades in the legend)
  std::string unit = "ms";
  std::string label_note;  // e.g. "numbers: micro-batch (1-based, as in the paper)"
  int width = 1400;        // pixels
};

std::string render_schedule_svg(const ScheduleSvg& s);

struct Plot {
  std::string title, x_label, y_label;
  std::vector<double> x, y;  // same length
  int width = 460, height = 280;
};

// A line plot with both axes, "nice" ticks (1, 2, 5 x 10^k) and labels; a
// plot without points says so.
std::string render_plot_svg(const Plot& p);

// Ticks for [lo, hi]: about `want` multiples of 1, 2 or 5 x 10^k inside it.
std::vector<double> nice_ticks(double lo, double hi, int want);

// Text for SVG/HTML: & < > " escaped.
std::string xml_escape(const std::string& s);

}  // namespace troupe::launcher::trace
