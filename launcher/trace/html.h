// A trace's pictures: one step's schedule (launcher/trace/svg.h's drawing of the
// measured ops and messages) and the self-contained HTML report of
// `troupe trace DIR --html FILE`: the schedule, the summary table and
// plots of loss, learning rate, tokens/s and grad norm from the run's
// metrics JSONL. The page loads nothing (no network, fonts or scripts from
// elsewhere): SVG inline, one small inline script.
//
//   trace::ScheduleSvg s = trace::step_picture(t, ms, step, /*arrows=*/true);
//   absl::StatusOr<std::vector<trace::MetricsRow>> m = trace::read_metrics("run/metrics.jsonl");
//   std::string page = trace::html_report(t, summary, trace::render_schedule_svg(s), *m, "");
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/trace/messages.h"
#include "launcher/trace/summary.h"
#include "launcher/trace/svg.h"

namespace troupe::launcher::trace {

// The default step to draw: the last complete one, else the last with any
// compute op (then *partial is set), else -1.
int default_step(const Trace& t, bool* partial);

// Step `step` of the trace: a row per rank ordered by stage, then d, then t;
// its training forward and backward ops in ms from the step's first op,
// labelled with their micro-batch counted from 1 as the paper does; with
// `arrows`, each activation and gradient of the step from its send's post
// to its receive's completion.
ScheduleSvg step_picture(const Trace& t, const std::vector<Message>& ms, int step, bool arrows);

// One line of `troupe train --metrics-jsonl` (launcher/train_flags.cc).
struct MetricsRow {
  int step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
};
// Errors name the file and line; a line without one of the keys is one.
absl::StatusOr<std::vector<MetricsRow>> read_metrics(const std::string& path);

// metrics_note: said above the plots (e.g. "no metrics.jsonl in DIR").
std::string html_report(const Trace& t, const Summary& s, const std::string& schedule_svg,
                        const std::vector<MetricsRow>& metrics, const std::string& metrics_note,
                        const std::string& failure_text);

}  // namespace troupe::launcher::trace
