// The schedule picture of a measured step and the HTML report (launcher/trace/html.h).
#include "launcher/trace/html.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace troupe::launcher::trace {
namespace {
using json = nlohmann::json;

std::vector<const RankTrace*> rows_in_order(const Trace& t) {
  std::vector<const RankTrace*> rows;
  for (const RankTrace& r : t.ranks) rows.push_back(&r);
  std::sort(rows.begin(), rows.end(), [](const RankTrace* a, const RankTrace* b) {
    return std::tie(a->header.s, a->header.d, a->header.t) <
           std::tie(b->header.s, b->header.d, b->header.t);
  });
  return rows;
}

const char* kStyle = R"(body{font-family:sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f0f0f0}td.l{text-align:left}tr.hl td{background:#fff6d5}
pre{background:#f7f7f7;padding:10px;font-size:12px;overflow-x:auto}
.plots{display:flex;flex-wrap:wrap;gap:12px})";

// Highlights a table row under the mouse; marks the page ready (the
// chromium test reads the mark from the DOM to know the script ran).
const char* kScript = R"(document.querySelectorAll('tr.rank').forEach(function(r){
r.addEventListener('mouseenter',function(){r.classList.add('hl');});
r.addEventListener('mouseleave',function(){r.classList.remove('hl');});});
document.body.setAttribute('data-report','ready');)";

std::string table(const Trace& t, const Summary& s) {
  if (s.steps.empty()) return "<p>No complete step to summarize.</p>\n";
  const double n = static_cast<double>(s.steps.size());
  std::string out =
      "<table><tr><th>stage</th><th>rank</th><th>(d,s,t)</th><th>host</th><th>busy ms</th>"
      "<th>idle ms</th><th>comm ms</th><th>bubble</th><th>sent</th><th>sent MiB</th>"
      "<th>received</th><th>received MiB</th></tr>\n";
  for (const RankStats& r : s.ranks) {
    const Header& h = t.find(r.rank)->header;
    absl::StrAppend(
        &out,
        absl::StrFormat("<tr class=\"rank\"><td>%d</td><td>%d</td><td class=\"l\">%s</td><td "
                        "class=\"l\">%s</td><td>%.3f</td><td>%.3f</td><td>%.3f</td>"
                        "<td>%.1f%%</td><td>%d</td><td>%.2f</td><td>%d</td><td>%.2f</td></tr>\n",
                        h.s, r.rank, h.coord(), xml_escape(h.host), r.busy / n / 1e6,
                        r.idle / n / 1e6, r.comm / n / 1e6, 100 * r.bubble(), r.sent,
                        r.bytes_sent / 1048576.0, r.received, r.bytes_received / 1048576.0));
  }
  absl::StrAppend(&out, "</table>\n<p>");
  for (const StageStats& st : s.stages) {
    absl::StrAppend(
        &out, absl::StrFormat("stage %d: bubble %.1f%%%s; ", st.stage, 100 * st.bubble,
                              s.has_slowest() && st.stage == s.slowest_stage ? " (slowest)" : ""));
  }
  absl::StrAppend(
      &out, absl::StrFormat("<b>mean bubble %.1f%%</b>, theory %s = %.1f%%.</p>\n",
                            100 * s.mean_bubble, xml_escape(s.theory_formula), 100 * s.theory));
  return out;
}

std::string plots(const std::vector<MetricsRow>& m) {
  Plot loss{"loss", "step", "loss", {}, {}}, lr{"learning rate", "step", "lr", {}, {}},
      tok{"throughput", "step", "tokens/s", {}, {}}, gn{"grad norm", "step", "grad norm", {}, {}};
  for (const MetricsRow& r : m) {
    for (Plot* p : {&loss, &lr, &tok, &gn}) {
      p->x.push_back(r.step);
      p->width = 350;  // four side by side on a 1500-pixel page
    }
    loss.y.push_back(r.loss);
    lr.y.push_back(r.lr);
    tok.y.push_back(r.tokens_per_s);
    gn.y.push_back(r.grad_norm);
  }
  std::string out = "<div class=\"plots\">\n";
  for (const Plot* p : {&loss, &lr, &tok, &gn}) absl::StrAppend(&out, render_plot_svg(*p));
  return out + "</div>\n";
}

}  // namespace

int default_step(const Trace& t, bool* partial) {
  *partial = false;
  std::vector<int> complete = complete_steps(t, nullptr);
  if (!complete.empty()) return complete.back();
  int last = -1;
  for (const RankTrace& r : t.ranks) {
    for (const Event& e : r.events) {
      if (e.compute() && !e.eval) last = std::max(last, e.step);
    }
  }
  *partial = last >= 0;
  return last;
}

ScheduleSvg step_picture(const Trace& t, const std::vector<Message>& ms, int step, bool arrows) {
  ScheduleSvg s;
  const std::vector<const RankTrace*> rows = rows_in_order(t);
  std::map<int, int> row_of;  // global rank -> row
  std::int64_t t0 = std::numeric_limits<std::int64_t>::max();
  for (const RankTrace* r : rows) {
    row_of[r->header.rank] = static_cast<int>(s.rows.size());
    s.rows.push_back(
        absl::StrFormat("stage %d  rank %d %s", r->header.s, r->header.rank, r->header.coord()));
    for (const Event& e : r->events) {
      if (e.compute() && !e.eval && e.step == step) t0 = std::min(t0, e.b);
    }
  }
  if (t0 == std::numeric_limits<std::int64_t>::max()) t0 = 0;
  auto at = [t0](std::int64_t ns) { return static_cast<double>(ns - t0) / 1e6; };
  const Header& h = t.ranks.front().header;
  s.chunks = std::max(h.v, 1);
  s.title = absl::StrFormat("step %d: %s, p=%d, m=%d%s", step, h.schedule, h.pp,
                            step_micro_batches(t, step),
                            s.chunks > 1 ? absl::StrFormat(", v=%d", s.chunks) : "");
  s.label_note = "numbers: micro-batch, counted from 1 as in the Megatron paper";
  for (const RankTrace* r : rows) {
    for (const Event& e : r->events) {
      if (!e.compute() || e.eval || e.step != step) continue;
      const std::int64_t end = e.open ? e.b : e.e;
      s.blocks.push_back({row_of[r->header.rank], at(e.b), at(end),
                          e.kind == Kind::kForward    ? Pass::kForward
                          : e.kind == Kind::kBackward ? Pass::kBackward
                                                      : Pass::kWeight,
                          std::clamp(e.chunk, 0, s.chunks - 1), absl::StrCat(e.mb + 1),
                          absl::StrFormat("%s mb %d (1-based %d) chunk %d, rank %d: %.3f-%.3f ms",
                                          kind_name(e.kind), e.mb, e.mb + 1, std::max(e.chunk, 0),
                                          r->header.rank, at(e.b), at(end))});
    }
  }
  if (!arrows) return s;
  for (const Message& m : ms) {
    if (!m.matched() || !row_of.count(m.from) || !row_of.count(m.to)) continue;
    const Event& snd = event_of(t, *m.send);
    const Event& rcv = event_of(t, *m.recv);
    if (rcv.open || snd.step != step || (snd.msg != "activation" && snd.msg != "gradient"))
      continue;
    s.arrows.push_back({row_of[m.from], at(snd.b), row_of[m.to], at(rcv.e),
                        snd.msg == "activation" ? Pass::kForward : Pass::kBackward});
  }
  return s;
}

absl::StatusOr<std::vector<MetricsRow>> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<MetricsRow> out;
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (line.empty()) continue;
    json o = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (o.is_discarded() || !o.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not a JSON object"));
    }
    MetricsRow r;
    for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s"}) {
      if (!o.contains(key) || !o[key].is_number()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": no number \"", key, "\""));
      }
    }
    r.step = o["step"].get<int>();
    r.loss = o["loss"].get<double>();
    r.lr = o["lr"].get<double>();
    r.grad_norm = o["grad_norm"].get<double>();
    r.tokens_per_s = o["tokens_per_s"].get<double>();
    out.push_back(r);
  }
  return out;
}

std::string html_report(const Trace& t, const Summary& s, const std::string& schedule_svg,
                        const std::vector<MetricsRow>& metrics, const std::string& metrics_note,
                        const std::string& failure_text) {
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>troupe trace ",
      xml_escape(t.dir), "</title><style>", kStyle, "</style></head><body>\n<h1>troupe trace ",
      xml_escape(t.dir), "</h1>\n<h2>Schedule</h2>\n", schedule_svg, "<h2>Summary</h2>\n",
      table(t, s), "<pre>", xml_escape(s.text()), "</pre>\n");
  if (!failure_text.empty()) {
    absl::StrAppend(&out, "<h2>Failure analysis</h2>\n<pre>", xml_escape(failure_text), "</pre>\n");
  }
  absl::StrAppend(&out, "<h2>Training metrics</h2>\n");
  if (!metrics_note.empty()) absl::StrAppend(&out, "<p>", xml_escape(metrics_note), "</p>\n");
  absl::StrAppend(&out, plots(metrics), "<script>", kScript, "</script>\n</body></html>\n");
  return out;
}

}  // namespace troupe::launcher::trace
