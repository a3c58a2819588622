// Failure and stall analysis of a trace (launcher/trace/failure.h).
#include "launcher/trace/failure.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace troupe::launcher::trace {
namespace {

struct Ctx {
  const Trace& t;
  std::int64_t origin;
  double at(std::int64_t ns) const { return static_cast<double>(ns - origin) / 1e6; }
  std::string who(int rank) const {
    const RankTrace* r = t.find(rank);
    return r ? r->header.describe() : absl::StrCat("rank ", rank, " (no trace file)");
  }
};

// rank -> target -> the step of the open event that waits on target.
using Graph = std::map<int, std::map<int, int>>;

std::string mb_text(const Event& e) { return e.mb >= 0 ? absl::StrCat(" mb ", e.mb) : ""; }

std::string open_text(const Ctx& c, const Event& e) {
  switch (e.kind) {
    case Kind::kRecv:
      return absl::StrFormat("receive of %s%s from rank %d (step %d, posted at %.3f ms)", e.msg,
                             mb_text(e), e.peer, e.step, c.at(e.b));
    case Kind::kSend:
      return absl::StrFormat("send of %s%s to rank %d (step %d, posted at %.3f ms)", e.msg,
                             mb_text(e), e.peer, e.step, c.at(e.b));
    case Kind::kWait:
      return absl::StrFormat("%s waits for %s%s%s (step %d, since %.3f ms)", e.actor, e.what,
                             mb_text(e), e.peer >= 0 ? absl::StrCat(" from rank ", e.peer) : "",
                             e.step, c.at(e.b));
    case Kind::kCollective:
      return absl::StrFormat("%s %s #%d (step %d, since %.3f ms)", e.group, e.op, e.seq, e.step,
                             c.at(e.b));
    default:
      return absl::StrFormat("%s%s (step %d, since %.3f ms)", kind_name(e.kind), mb_text(e), e.step,
                             c.at(e.b));
  }
}

void per_rank(const Ctx& c, std::string* out) {
  absl::StrAppend(
      out, "per rank: why its file was written, its last completed compute op, its open events\n");
  for (const RankTrace& r : c.t.ranks) {
    const Event* last = nullptr;
    for (const Event& e : r.events) {
      if (e.compute() && !e.open && (last == nullptr || e.e > last->e)) last = &e;
    }
    const std::string first_line = r.header.message.substr(0, r.header.message.find('\n'));
    absl::StrAppend(out, "  ", r.header.describe(), ": ", r.header.reason,
                    first_line.empty() ? "" : absl::StrCat(" (", first_line, ")"), "\n");
    absl::StrAppend(out, "    last completed: ",
                    last == nullptr ? "no compute op"
                                    : absl::StrFormat("%s%s of step %d, ended at %.3f ms",
                                                      kind_name(last->kind), mb_text(*last),
                                                      last->step, c.at(last->e)),
                    "\n");
    int open = 0;
    for (const Event& e : r.events) {
      if (!e.open) continue;
      absl::StrAppend(out, "    open: ", open_text(c, e), "\n");
      open++;
    }
    if (open == 0) absl::StrAppend(out, "    open: nothing\n");
  }
}

void messages(const Ctx& c, const std::vector<Message>& ms, std::string* out) {
  std::string lines;
  int own = 0;  // a rank's messages to itself (its shard's gradient pieces to its optimizer)
  for (const Message& m : ms) {
    const bool pending = !m.matched() || event_of(c.t, *m.recv).open;
    if (m.from == m.to && pending) {
      own++;
      continue;
    }
    if (m.matched()) {
      const Event& r = event_of(c.t, *m.recv);
      const Event& s = event_of(c.t, *m.send);
      if (!r.open) continue;
      absl::StrAppend(
          &lines, absl::StrFormat("  rank %d waits for rank %d: %s%s of step %d sent at %.3f ms, "
                                  "never arrived\n",
                                  m.to, m.from, s.msg, mb_text(s), s.step, c.at(s.b)));
    } else if (m.recv) {
      const Event& r = event_of(c.t, *m.recv);
      if (!r.open) {
        absl::StrAppend(&lines, absl::StrFormat("  rank %d received %s%s of step %d from rank %d, "
                                                "whose send is not in the trace\n",
                                                m.to, r.msg, mb_text(r), r.step, m.from));
        continue;
      }
      absl::StrAppend(
          &lines,
          absl::StrFormat("  rank %d waits for rank %d: receive of %s%s of step %d "
                          "(tag %s) posted at %.3f ms; rank %d has not sent it\n",
                          m.to, m.from, r.msg, mb_text(r), r.step, m.tag, c.at(r.b), m.from));
    } else {
      const Event& s = event_of(c.t, *m.send);
      absl::StrAppend(
          &lines, absl::StrFormat("  rank %d sent %s%s of step %d to rank %d at %.3f ms%s; rank %d "
                                  "posted no receive for it\n",
                                  m.from, s.msg, mb_text(s), s.step, m.to, c.at(s.b),
                                  s.open ? " (still open)" : "", m.to));
    }
  }
  if (own > 0) {
    absl::StrAppend(&lines, "  (and ", own,
                    " of a rank to itself, as its optimizer's receives of its ",
                    "own shard's gradient pieces)\n");
  }
  if (lines.empty()) lines = "  none\n";
  absl::StrAppend(out, "messages posted on one side and never completed or matched:\n", lines);
}

// Per TP group, the lowest collective seq some members entered and others
// did not (PyTorch's analyzer reports the first mismatch likewise); adds
// the edges from each member inside it to each that is missing.
void collectives(const Ctx& c, Graph* g, std::string* out) {
  const int tp = c.t.ranks.front().header.tp;
  // TP group (ranks g*tp .. g*tp+tp-1: t is fastest) -> seq -> rank -> its event.
  std::map<int, std::map<int, std::map<int, const Event*>>> by_group;
  std::map<int, int> last_seq, first_seq;  // rank -> its highest, lowest seq
  for (const RankTrace& r : c.t.ranks) {
    const int rank = r.header.rank;
    for (const Event& e : r.events) {
      if (e.kind != Kind::kCollective || e.seq < 0) continue;
      by_group[rank / tp][e.seq][rank] = &e;
      auto [it, fresh] = last_seq.emplace(rank, e.seq);
      if (!fresh) it->second = std::max(it->second, e.seq);
      auto [lo, lo_fresh] = first_seq.emplace(rank, e.seq);
      if (!lo_fresh) lo->second = std::min(lo->second, e.seq);
    }
  }
  std::string lines;
  for (const auto& [group, seqs] : by_group) {
    // Below the highest first seq of a member, a collective may be missing
    // because that member's ring overwrote it, not because it never came.
    int floor = 0;
    for (int q = group * tp; q < (group + 1) * tp; q++) {
      if (first_seq.count(q) && c.t.find(q)->header.dropped > 0)
        floor = std::max(floor, first_seq[q]);
    }
    for (const auto& [seq, events] : seqs) {
      if (seq < floor) continue;
      std::set<int> in;
      for (const auto& [rank, e] : events) in.insert(rank);
      std::vector<int> missing;
      for (int q = group * tp; q < (group + 1) * tp; q++) {
        if (!in.count(q)) missing.push_back(q);
      }
      if (missing.empty()) continue;
      const Event& e = *events.begin()->second;
      std::vector<std::string> lasts;
      for (int q : missing) {
        lasts.push_back(last_seq.count(q) ? absl::StrCat("rank ", q, "'s last: #", last_seq[q])
                                          : absl::StrCat("rank ", q, ": none"));
      }
      absl::StrAppend(
          &lines, absl::StrFormat("  not all ranks joined %s %s #%d (step %d%s): entered by ranks "
                                  "%s; missing ranks %s (%s)\n",
                                  e.group, e.op, seq, e.step, mb_text(e), absl::StrJoin(in, ", "),
                                  absl::StrJoin(missing, ", "), absl::StrJoin(lasts, "; ")));
      for (int r : in) {
        for (int q : missing) (*g)[r][q] = std::max((*g)[r][q], e.step);
      }
      break;  // the first mismatch of the group
    }
  }
  if (lines.empty()) lines = "  none\n";
  absl::StrAppend(out, "TP collectives some ranks entered and others never did:\n", lines);
}

// Which open events say where the pipeline is blocked: a shard's (its
// receives and sends of activations, gradients and TP steps, its waits). An
// optimizer's waits for gradient pieces of other replicas follow the
// shards (they wait for backward passes to end) and form cycles among the
// partitions: they count only when nothing else waits.
enum class Edges { kShards, kAll };

bool shard_wait(const Event& e) {
  if (e.kind == Kind::kWait) return e.actor != "optimizer";
  return e.msg == "activation" || e.msg == "gradient" || e.msg == "tp" || e.msg == "collective";
}

void open_edges(const Trace& t, Edges which, Graph* g) {
  for (const RankTrace& r : t.ranks) {
    // A rank whose stream is inside an op that never ended is where the
    // waits end (a hung kernel, an op slower than the watchdog): an op's
    // inputs had all arrived when it began, so what its actor waits for
    // next does not hold it up. Only its TP peers can (the collectives
    // inside the op).
    bool stuck = false;
    for (const Event& e : r.events) stuck |= e.open && e.compute();
    for (const Event& e : r.events) {
      const bool waits = e.kind == Kind::kRecv || e.kind == Kind::kSend || e.kind == Kind::kWait;
      if (!e.open || !waits || e.peer < 0 || e.peer == r.header.rank) continue;
      if (stuck && e.msg != "tp" && e.msg != "collective") continue;
      if (which == Edges::kShards && !shard_wait(e)) continue;
      (*g)[r.header.rank][e.peer] = std::max((*g)[r.header.rank][e.peer], e.step);
    }
  }
}

std::string why_stalled(const Ctx& c, int q, int step) {
  const RankTrace* r = c.t.find(q);
  if (r == nullptr) return "wrote no trace file (it died or its file was lost)";
  const Event* began = nullptr;
  for (const Event& e : r->events) {
    if (e.step != step) continue;
    if (e.kind == Kind::kStep && e.pass != "eval") began = &e;
    if (e.open && e.compute()) {
      return absl::StrFormat("is still in %s%s of step %d, since %.3f ms (it never ended)",
                             kind_name(e.kind), mb_text(e), step, c.at(e.b));
    }
  }
  if (began == nullptr) return absl::StrFormat("has not begun step %d", step);
  if (!began->open) return absl::StrFormat("finished step %d", step);
  return absl::StrFormat("began step %d and waits on no other rank", step);
}

// label: "likely stalled: " (a stall) or "the waits end at: " (a failure,
// whose message names the rank that failed).
std::vector<int> culprits(const Ctx& c, const Graph& g, const char* label, std::string* out) {
  // q -> (the latest step waited in, the ranks waiting)
  std::map<int, std::pair<int, std::set<int>>> pointed;
  for (const auto& [r, targets] : g) {
    for (const auto& [q, step] : targets) {
      auto& p = pointed[q];
      p.first = std::max(p.first, step);
      p.second.insert(r);
    }
  }
  std::vector<int> found;
  for (const auto& [q, p] : pointed) {
    // A rank that itself waits on another rank in that step only passes
    // the wait on; the culprit is where the waits end.
    bool waits_on_others = false;
    if (auto out_edges = g.find(q); out_edges != g.end()) {
      for (const auto& [target, step] : out_edges->second) waits_on_others |= step >= p.first;
    }
    if (waits_on_others) continue;
    found.push_back(q);
    absl::StrAppend(out, label, c.who(q), ": ", why_stalled(c, q, p.first),
                    " (waited for by ranks ", absl::StrJoin(p.second, ", "), ")\n");
  }
  if (found.empty() && !pointed.empty()) {
    std::vector<int> ranks;
    for (const auto& [q, p] : pointed) ranks.push_back(q);
    absl::StrAppend(out, label, "a wait-for cycle: every rank waited for (",
                    absl::StrJoin(ranks, ", "), ") itself waits for another\n");
  }
  return found;
}

}  // namespace

FailureAnalysis analyze_failure(const Trace& t, const std::vector<Message>& ms) {
  FailureAnalysis a;
  for (const RankTrace& r : t.ranks) {
    a.triggered |= r.header.reason == "failure" || r.header.reason == "stall";
    for (const Event& e : r.events) a.triggered |= e.open;
  }
  if (!a.triggered || t.ranks.empty()) return a;
  const Ctx c{t, t.origin()};
  std::string out = "failure analysis (times in ms from the trace's start):\n";
  // The run's failure or stall message, once (every rank's file has it;
  // per rank only its first line).
  for (const RankTrace& r : t.ranks) {
    if (r.header.message.find('\n') == std::string::npos) continue;
    absl::StrAppend(&out, "the run's message (", r.header.describe(), "):\n    ",
                    absl::StrReplaceAll(r.header.message, {{"\n", "\n    "}}), "\n");
    break;
  }
  per_rank(c, &out);
  messages(c, ms, &out);
  Graph tp;  // from each member inside a TP collective to each missing one
  collectives(c, &tp, &out);
  Graph g = tp;
  open_edges(t, Edges::kShards, &g);
  if (g.empty()) {
    g = tp;
    open_edges(t, Edges::kAll, &g);
  }
  bool failed = false;
  for (const RankTrace& r : t.ranks) failed |= r.header.reason == "failure";
  a.stalled = culprits(c, g, failed ? "the waits end at: " : "likely stalled: ", &out);
  for (const RankTrace& r : t.ranks) {
    if (r.header.reason != "failure" || r.header.message.empty()) continue;
    absl::StrAppend(
        &out, "the run failed: ", r.header.message.substr(0, r.header.message.find('\n')), "\n");
    break;
  }
  if (g.empty())
    absl::StrAppend(&out, "no rank waits for another: nothing points at a stalled rank\n");
  a.text = out;
  return a;
}

}  // namespace troupe::launcher::trace
