// `troupe trace DIR`: what the per-rank trace files of a run say.
//   troupe trace DIR                          summary (and failure analysis) to stdout
//   troupe trace DIR -o trace.json            + one Chrome/Perfetto trace, a flow per message
//   troupe trace DIR --svg s.svg [--step K] [--arrows]   one step drawn as the Megatron paper does
//   troupe trace DIR --html r.html [--metrics F]         a self-contained report
//   troupe trace DIR --messages [--rank R] [--micro-batch M] [--kind K]   the message log
// DIR holds rank-NNNNN.trace.jsonl (docs/ARCHITECTURE.md has the format):
// --trace DIR, or the flight recorder's RUNDIR/flight/. Bad files are an
// error naming the file and line, and exit 1; every file written atomically.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "launcher/commands.h"
#include "launcher/trace/failure.h"
#include "launcher/trace/files.h"
#include "launcher/trace/html.h"
#include "launcher/trace/merge.h"
#include "launcher/trace/messages.h"
#include "launcher/trace/summary.h"
#include "launcher/trace/svg.h"
#include "model/atomic_file.h"

namespace troupe::launcher {
namespace {

struct TraceFlags {
  std::string dir, json_out, svg, html, metrics;
  std::optional<int> step, rank, micro_batch;
  std::optional<std::string> kind;
  bool arrows = false, messages = false;
};

int write(const std::string& flag, const std::string& path, const std::string& bytes) {
  absl::Status st = model::write_file_atomically(path, bytes);
  if (!st.ok())
    return command_failed("trace",
                          absl::InvalidArgumentError(absl::StrCat(flag, " ", st.message())));
  std::fprintf(stderr, "troupe trace: wrote %s\n", path.c_str());
  return 0;
}

bool has_step(const trace::Trace& t, int step) {
  for (const trace::RankTrace& r : t.ranks) {
    for (const trace::Event& e : r.events) {
      if (e.step == step) return true;
    }
  }
  return false;
}

// The step to draw: --step, or the last complete one.
absl::StatusOr<int> picture_step(const TraceFlags& f, const trace::Trace& t) {
  if (f.step) return *f.step;
  bool partial = false;
  const int k = trace::default_step(t, &partial);
  if (k < 0) return absl::NotFoundError(absl::StrCat(t.dir, ": no compute op to draw"));
  if (partial)
    std::fprintf(stderr, "troupe trace: no complete step; drawing step %d as it is\n", k);
  return k;
}

int html(const TraceFlags& f, const trace::Trace& t, const std::vector<trace::Message>& ms,
         const trace::Summary& s, const std::string& failure) {
  absl::StatusOr<int> k = picture_step(f, t);
  if (!k.ok()) return command_failed("trace", k.status());
  std::string note;
  std::vector<trace::MetricsRow> rows;
  const std::string path = f.metrics.empty() ? f.dir + "/metrics.jsonl" : f.metrics;
  std::error_code ec;
  if (f.metrics.empty() && !std::filesystem::exists(path, ec)) {
    note = absl::StrCat("No metrics: ", path, " does not exist (--metrics FILE names one).");
  } else {
    absl::StatusOr<std::vector<trace::MetricsRow>> m = trace::read_metrics(path);
    if (!m.ok())
      return command_failed(
          "trace", absl::InvalidArgumentError(absl::StrCat("--metrics ", m.status().message())));
    rows = std::move(*m);
    note = absl::StrCat("From ", path, ".");
  }
  const std::string svg = trace::render_schedule_svg(trace::step_picture(t, ms, *k, true));
  return write("--html", f.html, trace::html_report(t, s, svg, rows, note, failure));
}

int run(const TraceFlags& f) {
  absl::StatusOr<trace::Trace> t = trace::read_trace(f.dir);
  if (!t.ok()) return command_failed("trace", t.status());
  const std::vector<trace::Message> ms = trace::match_messages(*t);
  if (f.messages) {
    trace::MessageFilter filter{f.rank, f.micro_batch, f.kind};
    std::fputs(trace::message_log(*t, ms, filter).c_str(), stdout);
    return 0;
  }
  if (f.step && !has_step(*t, *f.step)) {
    return command_failed("trace", absl::InvalidArgumentError(absl::StrCat(
                                       "--step ", *f.step, ": no event of that step in ", f.dir)));
  }
  const trace::Summary s = trace::summarize(*t, ms, f.step);  // --step: that step alone
  const trace::FailureAnalysis a = trace::analyze_failure(*t, ms);
  std::fputs(s.text().c_str(), stdout);
  if (a.triggered) std::fputs(a.text.c_str(), stdout);
  std::fflush(stdout);
  if (!f.json_out.empty()) {
    if (int rc = write("-o", f.json_out, trace::chrome_json(*t, ms)); rc != 0) return rc;
  }
  if (!f.svg.empty()) {
    absl::StatusOr<int> k = picture_step(f, *t);
    if (!k.ok()) return command_failed("trace", k.status());
    const std::string svg = trace::render_schedule_svg(trace::step_picture(*t, ms, *k, f.arrows));
    if (int rc = write("--svg", f.svg, svg); rc != 0) return rc;
  }
  if (!f.html.empty()) return html(f, *t, ms, s, a.text);
  return 0;
}

}  // namespace

Command add_trace_command(CLI::App& app) {
  auto f = std::make_shared<TraceFlags>();
  CLI::App* cmd = app.add_subcommand("trace", "Summarize, merge and draw a run's per-rank traces");
  cmd->add_option("dir", f->dir,
                  "Directory of rank-NNNNN.trace.jsonl files (--trace DIR, RUNDIR/flight)")
      ->required();
  cmd->add_option("-o,--output", f->json_out, "Write one Chrome/Perfetto trace-event JSON file");
  cmd->add_option("--svg", f->svg, "Draw one step's schedule as SVG");
  cmd->add_option("--step", f->step,
                  "The step to summarize and draw (default: every complete step; the last one "
                  "drawn)");
  cmd->add_flag("--arrows", f->arrows, "Draw each activation and gradient message in --svg");
  cmd->add_option("--html", f->html, "Write a self-contained HTML report");
  cmd->add_option("--metrics", f->metrics, "Metrics JSONL for --html (default DIR/metrics.jsonl)");
  CLI::Option* messages = cmd->add_flag("--messages", f->messages,
                                        "Print every message in time order instead of the summary");
  cmd->add_option("--rank", f->rank, "--messages: only those to or from this global rank")
      ->needs(messages);
  cmd->add_option("--micro-batch", f->micro_batch, "--messages: only this micro-batch (0-based)")
      ->needs(messages);
  cmd->add_option("--kind", f->kind,
                  "--messages: activation, gradient, tp, grad-piece, param-piece, collective")
      ->needs(messages);
  cmd->get_option("--arrows")->needs(cmd->get_option("--svg"));
  return [f] { return run(*f); };
}

}  // namespace troupe::launcher
