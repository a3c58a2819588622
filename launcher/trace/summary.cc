// Busy, idle, communication and the bubble per stage (launcher/trace/summary.h).
#include "launcher/trace/summary.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace troupe::launcher::trace {
namespace {

double ms(double ns) { return ns / 1e6; }

// Each rank's events by step (indices into RankTrace::events), built once:
// a long trace holds thousands of steps.
class StepIndex {
 public:
  explicit StepIndex(const Trace& t) : by_rank_(t.ranks.size()), oldest_end_(t.ranks.size()) {
    for (std::size_t ri = 0; ri < t.ranks.size(); ri++) {
      const std::vector<Event>& events = t.ranks[ri].events;
      // The end of the oldest event a rank kept: with a ring that dropped
      // events, anything that ended before it may be lost.
      std::int64_t oldest = std::numeric_limits<std::int64_t>::max();
      for (std::size_t i = 0; i < events.size(); i++) {
        by_rank_[ri][events[i].step].push_back(static_cast<int>(i));
        if (!events[i].open) oldest = std::min(oldest, events[i].e);
      }
      oldest_end_[ri] = oldest;
    }
  }
  const std::vector<int>& of(std::size_t ri, int step) const {
    static const std::vector<int> kNone;
    auto it = by_rank_[ri].find(step);
    return it == by_rank_[ri].end() ? kNone : it->second;
  }
  std::int64_t oldest_end(std::size_t ri) const { return oldest_end_[ri]; }

 private:
  std::vector<std::map<int, std::vector<int>>> by_rank_;  // by position in Trace::ranks
  std::vector<std::int64_t> oldest_end_;
};

// Why step k is not whole on ranks[ri], or "".
std::string incomplete(const Trace& t, const StepIndex& idx, std::size_t ri, int k) {
  const RankTrace& r = t.ranks[ri];
  const Event* s = nullptr;
  for (int i : idx.of(ri, k)) {
    const Event& e = r.events[static_cast<std::size_t>(i)];
    if (e.kind == Kind::kStep && e.pass != "eval") s = &e;
  }
  if (s == nullptr) return absl::StrCat("no record of it on ", r.header.describe());
  if (s->open) return absl::StrCat("not finished on ", r.header.describe());
  if (r.header.dropped > 0 && s->b < idx.oldest_end(ri)) {
    return absl::StrCat("its start was overwritten in the ring of ", r.header.describe());
  }
  return "";
}

std::vector<int> complete_in(const Trace& t, const StepIndex& idx,
                             std::vector<std::string>* skipped) {
  std::set<int> steps;
  for (const RankTrace& r : t.ranks) {
    for (const Event& e : r.events) {
      if (e.kind == Kind::kStep && e.pass != "eval" && e.step > 0) steps.insert(e.step);
    }
  }
  std::vector<int> out;
  for (int k : steps) {
    std::string why;
    for (std::size_t ri = 0; ri < t.ranks.size() && why.empty(); ri++) {
      why = incomplete(t, idx, ri, k);
    }
    if (why.empty()) {
      out.push_back(k);
    } else if (skipped != nullptr) {
      skipped->push_back(absl::StrCat("step ", k, ": ", why));
    }
  }
  return out;
}

// The part of the gap before each op (since the previous op on its stream
// ended, or the step began) during which the message carrying its input
// was in flight: sent, not yet arrived. Ops in begin order.
std::int64_t comm_wait(const std::vector<const Event*>& ops, std::size_t ri,
                       const InputIndex& inputs, std::int64_t first) {
  std::int64_t n = 0, free_at = first;
  for (const Event* op : ops) {
    if (const Message* m = inputs.input_of(static_cast<int>(ri), *op)) {
      const std::int64_t lo = std::max(free_at, event_of(inputs.trace(), *m->send).b);
      const std::int64_t hi = std::min(op->b, event_of(inputs.trace(), *m->recv).e);
      if (hi > lo) n += hi - lo;
    }
    free_at = std::max(free_at, op->e);
  }
  return n;
}

void add_step(const Trace& t, const StepIndex& idx, const InputIndex& inputs, int k,
              std::map<int, RankStats>* stats) {
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = 0;
  for (std::size_t ri = 0; ri < t.ranks.size(); ri++) {
    for (int i : idx.of(ri, k)) {
      const Event& e = t.ranks[ri].events[static_cast<std::size_t>(i)];
      if (!training_op(e, k)) continue;
      first = std::min(first, e.b);
      last = std::max(last, e.e);
    }
  }
  if (last <= first) return;  // no compute ops in this step
  for (std::size_t ri = 0; ri < t.ranks.size(); ri++) {
    const RankTrace& r = t.ranks[ri];
    RankStats& st = (*stats)[r.header.rank];
    st.rank = r.header.rank;
    std::vector<const Event*> ops;
    for (int i : idx.of(ri, k)) {
      const Event& e = r.events[static_cast<std::size_t>(i)];
      if (training_op(e, k)) ops.push_back(&e);
      if (e.kind == Kind::kSend) {
        st.sent++;
        st.bytes_sent += e.bytes;
      } else if (e.kind == Kind::kRecv && !e.open) {
        st.received++;
        st.bytes_received += e.bytes;
      }
    }
    std::sort(ops.begin(), ops.end(), [](const Event* a, const Event* b) { return a->b < b->b; });
    std::vector<Interval> spans;
    for (const Event* e : ops) spans.push_back({e->b, e->e});
    st.ops += static_cast<int>(ops.size());
    const std::int64_t busy = length(union_of(spans));
    st.busy += busy;
    st.idle += (last - first) - busy;  // the span less the busy time
    st.span += last - first;
    st.comm += comm_wait(ops, ri, inputs, first);
  }
}

// The zero-bubble schedules' theory from the measured mean op times (F, B
// per op; W per forward, as zb-auto runs one W in pieces) of the
// summarized steps. ZB-H1 (and zb-auto, which starts from it, or from
// ZB-V's list on a V with --virtual-stages 2): Qi et al.'s
// (p-1)(F+B-W) of idle in a step of m(F+B+W) + that. ZB-V: the least a V
// can have, the last stage's wait for its first input, (p-1) chunk
// forwards, in a step of 2m(F+B+W) + that (what its list reaches when F =
// B = W).
void zero_bubble_theory(const Trace& t, Summary* s) {
  const Header& h = t.ranks.front().header;
  double sum[3] = {0, 0, 0};
  int forwards = 0, backwards = 0;
  for (int k : s->steps) {
    for (const RankTrace& r : t.ranks) {
      for (const Event& e : r.events) {
        if (!training_op(e, k)) continue;
        const double d = static_cast<double>(e.e - e.b);
        if (e.kind == Kind::kForward) {
          sum[0] += d;
          forwards++;
        } else if (e.kind == Kind::kBackward) {
          sum[1] += d;
          backwards++;
        } else {
          sum[2] += d;
        }
      }
    }
  }
  if (forwards == 0 || backwards == 0 || s->steps.empty()) return;
  const double F = sum[0] / forwards, B = sum[1] / backwards, W = sum[2] / forwards;
  const int p = h.pp, m = step_micro_batches(t, s->steps.back());
  const std::string costs = absl::StrFormat("F %.3g B %.3g W %.3g ms", F / 1e6, B / 1e6, W / 1e6);
  if (h.schedule == "zbv" || (h.schedule == "zb-auto" && h.v == 2)) {  // (zb-auto on a V)
    const double idle = (p - 1) * F, step = 2 * m * (F + B + W) + idle;
    s->theory = step > 0 ? idle / step : 0;
    s->theory_formula =
        absl::StrFormat("ZB-V's least (p-1)F/(2m(F+B+W)+(p-1)F), %s, m %d", costs, m);
    return;
  }
  const double idle = std::max(0.0, (p - 1) * (F + B - W)), step = m * (F + B + W) + idle;
  s->theory = step > 0 ? idle / step : 0;
  s->theory_formula =
      absl::StrFormat("ZB-H1's (p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W)), %s, m %d", costs, m);
}

void fill_stages(const Trace& t, Summary* s) {
  const Header& h = t.ranks.front().header;
  const double steps = static_cast<double>(s->steps.size());
  double slowest = -1, least = -1;
  for (int stage = 0; stage < h.pp; stage++) {
    StageStats st;
    st.stage = stage;
    int n = 0;
    double idle = 0, span = 0;
    for (const RankStats& r : s->ranks) {
      if (t.find(r.rank)->header.s != stage) continue;
      n++;
      st.busy += r.busy;
      st.comm += r.comm;
      idle += r.idle;
      span += r.span;
    }
    if (n == 0 || steps == 0) continue;
    st.busy /= n * steps;
    st.comm /= n * steps;
    st.idle = idle / (n * steps);
    st.span = span / (n * steps);
    st.bubble = span > 0 ? idle / span : 0;
    if (st.busy > slowest) {
      slowest = st.busy;
      s->slowest_stage = stage;
    }
    if (least < 0 || st.busy < least) least = st.busy;
    s->stages.push_back(st);
  }
  for (const StageStats& st : s->stages) s->mean_bubble += st.bubble / s->stages.size();
  s->slowest_excess = least > 0 ? slowest / least - 1 : 0;
  if (h.schedule == "zb-h1" || h.schedule == "zb-auto" || h.schedule == "zbv") {
    zero_bubble_theory(t, s);
    return;
  }
  // Each step's own m (a ramp-up changes it), the theory their mean.
  const int p = h.pp, v = h.schedule == "interleaved" ? h.v : 1;
  int m_min = 0, m_max = 0, den = 0;
  s->theory = 0;
  for (int k : s->steps) {
    const int m = step_micro_batches(t, k);
    m_min = m_min == 0 ? m : std::min(m_min, m);
    m_max = std::max(m_max, m);
    den = v * m + p - 1;
    s->theory += den > 0 ? static_cast<double>(p - 1) / den / s->steps.size() : 0;
  }
  if (m_min == m_max) {
    s->theory_formula = v > 1 ? absl::StrFormat("(p-1)/(v*m+p-1) = %d/%d", p - 1, den)
                              : absl::StrFormat("(p-1)/(m+p-1) = %d/%d", p - 1, den);
  } else {
    s->theory_formula =
        absl::StrFormat("the mean over the steps of (p-1)/(%sm+p-1), m from %d to %d (a ramp-up)",
                        v > 1 ? "v*" : "", m_min, m_max);
  }
}

}  // namespace

int step_micro_batches(const Trace& t, int k) {
  for (const RankTrace& r : t.ranks) {
    for (const Event& e : r.events) {
      if (e.kind == Kind::kStep && e.pass != "eval" && e.step == k && e.m > 0) return e.m;
    }
  }
  return t.ranks.front().header.m;
}

Interval step_bounds(const Trace& t, int k) {
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = 0;
  for (const RankTrace& r : t.ranks) {
    for (const Event& e : r.events) {
      if (!training_op(e, k)) continue;
      first = std::min(first, e.b);
      last = std::max(last, e.e);
    }
  }
  return last > 0 ? Interval{first, last} : Interval{0, 0};
}

std::vector<Interval> union_of(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

std::int64_t length(const std::vector<Interval>& v) {
  std::int64_t n = 0;
  for (const Interval& i : v) n += i.second - i.first;
  return n;
}

std::int64_t overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::int64_t n = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].first, b[j].first);
    const std::int64_t hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second) ? i++ : j++;
  }
  return n;
}

bool training_op(const Event& e, int step) {
  return e.compute() && !e.eval && !e.open && e.step == step;
}

std::vector<int> complete_steps(const Trace& t, std::vector<std::string>* skipped) {
  return complete_in(t, StepIndex(t), skipped);
}

Summary summarize(const Trace& t, const std::vector<Message>& ms, std::optional<int> only_step) {
  Summary s;
  s.trace = &t;
  const StepIndex idx(t);
  std::vector<std::string> skipped;
  std::vector<int> steps = complete_in(t, idx, &skipped);
  if (only_step) {
    const bool ok = std::find(steps.begin(), steps.end(), *only_step) != steps.end();
    for (const std::string& why : skipped) {
      if (why.rfind(absl::StrCat("step ", *only_step, ":"), 0) == 0) s.skipped.push_back(why);
    }
    if (!ok && s.skipped.empty()) {
      s.skipped.push_back(absl::StrCat("step ", *only_step, ": not in the trace"));
    }
    steps = ok ? std::vector<int>{*only_step} : std::vector<int>{};
  } else {
    s.skipped = skipped;
  }
  s.steps = steps;
  for (const Message& m : ms) (m.matched() ? s.matched : s.unmatched)++;
  if (steps.empty() || t.ranks.empty()) return s;
  std::map<int, RankStats> stats;
  const InputIndex inputs(t, ms);
  for (int k : steps) add_step(t, idx, inputs, k, &stats);
  for (auto& [rank, st] : stats) s.ranks.push_back(st);
  std::sort(s.ranks.begin(), s.ranks.end(), [&t](const RankStats& a, const RankStats& b) {
    const Header& x = t.find(a.rank)->header;
    const Header& y = t.find(b.rank)->header;
    return std::tie(x.s, x.d, x.t) < std::tie(y.s, y.d, y.t);
  });
  fill_stages(t, &s);
  s.path_step = steps.back();
  s.critical_path = critical_path(t, ms, s.path_step);
  const auto [first, last] = step_bounds(t, s.path_step);
  s.path_span = last - first;
  return s;
}

}  // namespace troupe::launcher::trace

namespace troupe::launcher::trace {
namespace {

std::string step_list(const std::vector<int>& steps) {
  if (steps.empty()) return "none";
  bool consecutive = true;
  for (std::size_t i = 1; i < steps.size(); i++) consecutive &= steps[i] == steps[i - 1] + 1;
  if (consecutive && steps.size() > 2) return absl::StrCat(steps.front(), "-", steps.back());
  return absl::StrJoin(steps, ", ");
}

void append_ranks(const Summary& s, std::string* out) {
  const double n = static_cast<double>(s.steps.size());
  absl::StrAppend(out, "per rank (times in ms per step; messages and bytes over those steps):\n");
  absl::StrAppend(out, absl::StrFormat("  %5s %5s %-9s %-12s %9s %9s %9s %7s %14s %14s\n", "stage",
                                       "rank", "(d,s,t)", "host", "busy", "idle", "comm", "bubble",
                                       "sent", "received"));
  for (const RankStats& r : s.ranks) {
    const Header& h = s.trace->find(r.rank)->header;
    absl::StrAppend(
        out, absl::StrFormat(
                 "  %5d %5d %-9s %-12s %9.3f %9.3f %9.3f %6.1f%% %5d %6.2f MiB %5d %6.2f MiB\n",
                 h.s, r.rank, h.coord(), h.host, ms(r.busy / n), ms(r.idle / n), ms(r.comm / n),
                 100 * r.bubble(), r.sent, r.bytes_sent / 1048576.0, r.received,
                 r.bytes_received / 1048576.0));
  }
}

void append_stages(const Summary& s, std::string* out) {
  absl::StrAppend(out, "per stage (ms per step, mean over its ranks):\n");
  for (const StageStats& st : s.stages) {
    absl::StrAppend(
        out, absl::StrFormat("  stage %d: busy %.3f  idle %.3f  comm %.3f  bubble %.1f%%%s\n",
                             st.stage, ms(st.busy), ms(st.idle), ms(st.comm), 100 * st.bubble,
                             s.has_slowest() && st.stage == s.slowest_stage ? "  (slowest)" : ""));
  }
  absl::StrAppend(
      out, absl::StrFormat("bubble: measured %.1f%% (mean over stages), theory %s = %.1f%%\n",
                           100 * s.mean_bubble, s.theory_formula, 100 * s.theory));
  if (s.slowest_stage >= 0 && !s.has_slowest()) {
    absl::StrAppend(
        out, "slowest stage: none (every stage's compute per step within 1% of the others)\n");
  } else if (s.has_slowest()) {
    absl::StrAppend(out,
                    absl::StrFormat("slowest stage: %d (the most compute per step: %.1f%% more "
                                    "than the least loaded)\n",
                                    s.slowest_stage, 100 * s.slowest_excess));
  }
}

void append_path(const Summary& s, std::string* out) {
  std::int64_t ops = 0, msgs = 0;
  std::size_t n_ops = 0, n_msgs = 0;
  for (const PathStep& p : s.critical_path) {
    (p.message ? msgs : ops) += p.duration;
    (p.message ? n_msgs : n_ops)++;
  }
  const std::int64_t start = step_bounds(*s.trace, s.path_step).first;
  absl::StrAppend(out,
                  absl::StrFormat("critical path of step %d (its span %.3f ms): %zu ops %.3f ms, "
                                  "%zu messages %.3f ms\n",
                                  s.path_step, ms(s.path_span), n_ops, ms(ops), n_msgs, ms(msgs)));
  for (const PathStep& p : s.critical_path) {
    absl::StrAppend(out, absl::StrFormat("  %+10.3f ms  %-8s %-48s %9.3f ms\n", ms(p.begin - start),
                                         p.message ? "message" : "op", p.what, ms(p.duration)));
  }
}

}  // namespace

std::string Summary::text() const {
  const Trace& t = *trace;
  std::string out;
  if (t.ranks.empty()) return out;
  const Header& h = t.ranks.front().header;
  absl::StrAppend(
      &out, absl::StrFormat("trace %s: %zu ranks of tp=%d pp=%d dp=%d, schedule %s, m=%d, v=%d\n",
                            t.dir, t.ranks.size(), h.tp, h.pp, h.dp, h.schedule, h.m, h.v));
  absl::StrAppend(
      &out, absl::StrFormat("clocks aligned through the coordinator: uncertainty up to %.3f ms\n",
                            ms(t.uncertainty_ns())));
  for (const std::string& w : t.warnings) absl::StrAppend(&out, "warning: ", w, "\n");
  bool dropped = false;
  for (const RankTrace& r : t.ranks) {
    dropped |= r.header.dropped > 0;
    if (r.header.trace_steps && &r == &t.ranks.front()) {
      absl::StrAppend(&out,
                      absl::StrFormat("recorded steps %d-%d only (--trace-steps)\n",
                                      r.header.trace_steps->first, r.header.trace_steps->second));
    }
  }
  std::string why_unmatched;
  if (unmatched > 0) {
    why_unmatched = dropped ? " (--messages lists them; rings overwrote some partners)"
                            : " (--messages lists them)";
  }
  absl::StrAppend(&out, absl::StrFormat("messages: %d matched (send -> receive), %d unmatched%s\n",
                                        matched, unmatched, why_unmatched));
  absl::StrAppend(&out, "steps summarized (fully inside the trace): ", step_list(steps), "\n");
  for (const std::string& why : skipped) absl::StrAppend(&out, "  skipped ", why, "\n");
  if (steps.empty()) return out;
  append_ranks(*this, &out);
  append_stages(*this, &out);
  append_path(*this, &out);
  absl::StrAppend(
      &out,
      "legend: span = first compute op of the step (any rank) to the last; busy = the\n"
      "  rank's forward and backward ops (TP collectives nest inside); idle = span - busy (the\n"
      "  bubble); comm = the part of idle spent waiting on a message already sent: before each\n"
      "  op, while the activation or gradient carrying its input was in flight (sent, not yet\n"
      "  arrived); bubble = idle / span\n");
  return out;
}

}  // namespace troupe::launcher::trace
