// Hang diagnosis on the wait-for graph of ranks (stall_analysis.h).
#include "actors/diagnostics/stall_analysis.h"

#include <algorithm>
#include <deque>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace troupe::actors {
namespace {

// What one rank's actors said, and why the rank is a root cause ("" when
// it is not: it answered and has begun the step).
struct RankState {
  const WaitReport* shard = nullptr;
  const WaitReport* optimizer = nullptr;
  std::vector<const WaitReport*> waiting;  // its actors that wait in this step
  bool shard_not_begun = false, optimizer_not_begun = false;
  std::string root;
};

bool waits_in(const WaitReport* r, int step) {
  return r != nullptr && r->step == step && !r->waiting.empty();
}

std::vector<RankState> index_ranks(const StallInput& in) {
  const int world = in.layout.world();
  std::vector<RankState> ranks(static_cast<std::size_t>(world));
  for (const WaitReport& r : in.reports) {
    if (r.rank < 0 || r.rank >= world) continue;
    RankState& rs = ranks[static_cast<std::size_t>(r.rank)];
    (absl::StartsWith(r.actor, "shard") ? rs.shard : rs.optimizer) = &r;
    if (waits_in(&r, in.step)) rs.waiting.push_back(&r);
  }
  for (int rank = 0; rank < world; rank++) {
    RankState& rs = ranks[static_cast<std::size_t>(rank)];
    const bool ready = static_cast<std::size_t>(rank) < in.ready.size() &&
                       in.ready[static_cast<std::size_t>(rank)];
    // A shard sets its step to 0 once it has reported ready, so a step
    // other than this one means "not begun" only for a shard not ready; an
    // optimizer keeps its step after the step. A ready rank may have begun
    // the next step, which came with this one's update (Coordinator): its
    // actors are then one step on.
    rs.shard_not_begun = rs.shard != nullptr && rs.shard->step != in.step && !ready;
    rs.optimizer_not_begun = rs.optimizer != nullptr && rs.optimizer->step != in.step &&
                             !(ready && rs.optimizer->step == in.step + 1);
    std::vector<std::string> why;
    if (rs.shard == nullptr) why.push_back("its shard did not answer");
    if (rs.shard_not_begun) why.push_back(absl::StrCat("has not begun step ", in.step));
    if (rs.optimizer == nullptr) why.push_back("its optimizer did not answer");
    if (rs.optimizer_not_begun) {
      why.push_back(absl::StrCat("its optimizer has not begun step ", in.step));
    }
    rs.root = absl::StrJoin(why, "; ");
  }
  // A stream that has not finished an op for the whole timeout: the rank is
  // a root cause (the op's inputs had all arrived when it fired), unless a
  // TP or DP peer is one (the op waits inside a TP collective, or in a DP
  // reduce where the ZeRO-1 pieces go device to device, for it). Only in
  // this step: a ready rank's op of the next step holds up nothing here.
  std::vector<bool> computing(static_cast<std::size_t>(world), false);
  for (int rank = 0; rank < world; rank++) {
    const RankState& rs = ranks[static_cast<std::size_t>(rank)];
    if (rs.shard == nullptr || rs.shard->computing.empty() || rs.shard_not_begun ||
        rs.shard->step != in.step) {
      continue;
    }
    bool peer_root = false;
    for (const std::vector<int>& group :
         {in.layout.tensor_group(rank), in.layout.data_group(rank)}) {
      for (int q : group) {
        peer_root = peer_root || (q != rank && !ranks[static_cast<std::size_t>(q)].root.empty());
      }
    }
    computing[static_cast<std::size_t>(rank)] = !peer_root;
  }
  for (int rank = 0; rank < world; rank++) {
    RankState& rs = ranks[static_cast<std::size_t>(rank)];
    if (!computing[static_cast<std::size_t>(rank)]) continue;
    const std::string why = absl::StrCat("its stream has not finished the ", rs.shard->computing);
    rs.root = rs.root.empty() ? why : absl::StrCat(rs.root, "; ", why);
  }
  return ranks;
}

// The ranks a waiting actor waits on. A named peer is the edge. Without one
// (peer -1) the two waits of the step's protocol are read from the layout:
// - an optimizer waits for the gradients of its data group's shards (and,
//   on stage 0, of the head stage's shards: the tied wte; the analysis does
//   not know which partitions own wte, so it counts them all); of those, it
//   waits on the shards still behind: root causes, or in the step and not
//   yet past their schedule (at an op, or busy). A shard waiting for its
//   new parameters has issued its last backward.
// - a shard past its schedule waits for the new parameters from its data
//   group's optimizers (and, on the last stage, stage 0's: the tied wte)
//   that still wait themselves.
// Anything else (a free activation slot) is local: no edge.
std::vector<int> wait_targets(const StallInput& in, const std::vector<RankState>& ranks,
                              const WaitReport& r) {
  if (r.peer >= 0) {  // a peer outside the layout is nobody the graph knows
    return r.peer < in.layout.world() ? std::vector<int>{r.peer} : std::vector<int>{};
  }
  const comm::Layout& l = in.layout;
  const comm::Coord c = l.coord(r.rank);
  const bool is_shard = &r == ranks[static_cast<std::size_t>(r.rank)].shard;
  if (is_shard && r.op_id >= 0) return {};
  std::vector<int> senders = l.data_group(r.rank);
  // The tied wte's two copies: the embedding's stage (0) and the head's
  // (the last; in zbv's V stage 0 holds both).
  const int head_stage = l.stage_of(l.chunks() - 1);
  const int tied_stage = is_shard ? 0 : head_stage;
  if (head_stage != 0 && c.s == (is_shard ? head_stage : 0)) {
    for (int x : l.data_group(l.rank({c.d, tied_stage, c.t}))) senders.push_back(x);
  }
  std::vector<int> out;
  for (int x : senders) {
    const RankState& rs = ranks[static_cast<std::size_t>(x)];
    const bool behind =
        !rs.root.empty() || (is_shard ? waits_in(rs.optimizer, in.step)
                                      : rs.shard->step == in.step &&
                                            (rs.shard->op_id >= 0 || rs.shard->waiting.empty()));
    if (behind) out.push_back(x);
  }
  return out;
}

// Rank -> the ranks it waits on (sorted, no self edges); a root cause waits
// on no one: it is where the waits end.
std::vector<std::vector<int>> wait_for_graph(const StallInput& in,
                                             const std::vector<RankState>& ranks) {
  std::vector<std::vector<int>> out(ranks.size());
  for (std::size_t r = 0; r < ranks.size(); r++) {
    if (!ranks[r].root.empty()) continue;
    for (const WaitReport* w : ranks[r].waiting) {
      for (int x : wait_targets(in, ranks, *w)) {
        if (x != static_cast<int>(r)) out[r].push_back(x);
      }
    }
    std::sort(out[r].begin(), out[r].end());
    out[r].erase(std::unique(out[r].begin(), out[r].end()), out[r].end());
  }
  return out;
}

// Strongly connected components (Kosaraju, iterative: a graph of thousands
// of ranks must not recurse that deep). Returns the component of each node.
std::vector<int> components(const std::vector<std::vector<int>>& out) {
  const int n = static_cast<int>(out.size());
  std::vector<std::vector<int>> in(out.size());
  for (int u = 0; u < n; u++) {
    for (int v : out[static_cast<std::size_t>(u)]) in[static_cast<std::size_t>(v)].push_back(u);
  }
  // Pass 1: nodes in order of finishing on the forward graph.
  std::vector<int> order, next(out.size(), 0);
  std::vector<bool> seen(out.size(), false);
  for (int s = 0; s < n; s++) {
    if (seen[static_cast<std::size_t>(s)]) continue;
    std::vector<int> stack{s};
    seen[static_cast<std::size_t>(s)] = true;
    while (!stack.empty()) {
      const int u = stack.back();
      const auto& succ = out[static_cast<std::size_t>(u)];
      int& i = next[static_cast<std::size_t>(u)];
      if (i < static_cast<int>(succ.size())) {
        const int v = succ[static_cast<std::size_t>(i++)];
        if (!seen[static_cast<std::size_t>(v)]) {
          seen[static_cast<std::size_t>(v)] = true;
          stack.push_back(v);
        }
      } else {
        order.push_back(u);
        stack.pop_back();
      }
    }
  }
  // Pass 2: on the reversed graph, in reverse finishing order.
  std::vector<int> comp(out.size(), -1);
  int k = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (comp[static_cast<std::size_t>(*it)] >= 0) continue;
    std::vector<int> stack{*it};
    comp[static_cast<std::size_t>(*it)] = k;
    while (!stack.empty()) {
      const int u = stack.back();
      stack.pop_back();
      for (int v : in[static_cast<std::size_t>(u)]) {
        if (comp[static_cast<std::size_t>(v)] < 0) {
          comp[static_cast<std::size_t>(v)] = k;
          stack.push_back(v);
        }
      }
    }
    k++;
  }
  return comp;
}

// A shortest cycle through `from` inside its component (breadth first),
// as ranks from `from` back to it.
std::vector<int> cycle_through(const std::vector<std::vector<int>>& out,
                               const std::vector<int>& comp, int from) {
  std::vector<int> parent(out.size(), -1);
  std::deque<int> queue{from};
  while (!queue.empty()) {
    const int u = queue.front();
    queue.pop_front();
    for (int v : out[static_cast<std::size_t>(u)]) {
      if (comp[static_cast<std::size_t>(v)] != comp[static_cast<std::size_t>(from)]) continue;
      if (v == from) {
        std::vector<int> path{from};
        for (int x = u; x != from; x = parent[static_cast<std::size_t>(x)]) path.push_back(x);
        path.push_back(from);
        std::reverse(path.begin() + 1, path.end() - 1);
        return path;
      }
      if (parent[static_cast<std::size_t>(v)] < 0 && v != from) {
        parent[static_cast<std::size_t>(v)] = u;
        queue.push_back(v);
      }
    }
  }
  return {from};  // not reached: a component of two or more has a cycle through every member
}

class Describer {
 public:
  explicit Describer(const StallInput& in) : in_(in) {}
  std::string host(int rank) const {
    return static_cast<std::size_t>(rank) < in_.hosts.size()
               ? in_.hosts[static_cast<std::size_t>(rank)]
               : "";
  }
  // "rank 3 (d=1 s=1 t=0) on host h1"
  std::string who(int rank) const {
    const comm::Coord c = in_.layout.coord(rank);
    const std::string h = host(rank);
    return absl::StrCat("rank ", rank, " (d=", c.d, " s=", c.s, " t=", c.t, ")",
                        h.empty() ? "" : absl::StrCat(" on host ", h));
  }
  // "(1,1,0)", the table's short form
  std::string coord(int rank) const {
    const comm::Coord c = in_.layout.coord(rank);
    return absl::StrCat("(", c.d, ",", c.s, ",", c.t, ")");
  }
  std::string from(const std::vector<int>& targets) const {
    if (targets.empty()) return "-";
    if (targets.size() == 1) return absl::StrCat("rank ", targets[0], " ", coord(targets[0]));
    return absl::StrCat("ranks ", absl::StrJoin(targets, ", "));
  }

 private:
  const StallInput& in_;
};

using Row = std::vector<std::string>;

// One row per waiting actor and per actor that did not answer or begin.
std::vector<Row> table_rows(const StallInput& in, const std::vector<RankState>& ranks,
                            const Describer& say) {
  std::vector<Row> rows;
  auto row = [&](int rank, std::string actor, std::string op, std::string what, std::string from,
                 std::string since) {
    Row x{absl::StrCat(rank), say.coord(rank)};
    if (!in.hosts.empty()) x.push_back(say.host(rank).empty() ? "?" : say.host(rank));
    for (std::string* s : {&actor, &op, &what, &from, &since}) x.push_back(std::move(*s));
    rows.push_back(std::move(x));
  };
  for (int rank = 0; rank < static_cast<int>(ranks.size()); rank++) {
    const RankState& rs = ranks[static_cast<std::size_t>(rank)];
    for (const bool shard : {true, false}) {
      const WaitReport* r = shard ? rs.shard : rs.optimizer;
      if (r == nullptr) {
        row(rank, shard ? "shard" : "optimizer", "-", "(did not answer)", "-", "-");
      } else if (shard ? rs.shard_not_begun : rs.optimizer_not_begun) {
        row(rank, r->actor, "-", absl::StrCat("has not begun step ", in.step), "-",
            absl::StrFormat("%.1f s", r->since_s));
      } else if (waits_in(r, in.step)) {
        row(rank, r->actor, r->op.empty() ? "-" : r->op, r->waiting,
            rs.root.empty() ? say.from(wait_targets(in, ranks, *r)) : "-",
            absl::StrFormat("%.1f s", r->since_s));
      }
    }
  }
  return rows;
}

std::string render_table(const StallInput& in, const std::vector<Row>& rows) {
  if (rows.empty()) return "";
  Row head{"rank", "(d,s,t)"};
  if (!in.hosts.empty()) head.push_back("host");
  for (const char* h : {"actor", "op / micro-batch", "waiting for", "from", "since"}) {
    head.push_back(h);
  }
  // Each column as wide as its widest cell; two spaces between columns.
  std::vector<std::size_t> width(head.size(), 0);
  auto widen = [&](const Row& r) {
    for (std::size_t i = 0; i < r.size(); i++) width[i] = std::max(width[i], r[i].size());
  };
  widen(head);
  for (const Row& r : rows) widen(r);
  std::string text;
  auto line = [&](const Row& r) {
    std::string s = "  ";
    for (std::size_t i = 0; i < r.size(); i++) {
      absl::StrAppend(&s, r[i],
                      i + 1 < r.size() ? std::string(width[i] - r[i].size() + 2, ' ') : "");
    }
    absl::StrAppend(&text, text.empty() ? "" : "\n", s);
  };
  line(head);
  for (const Row& r : rows) line(r);
  return text;
}

// Why a rank that waits for no other rank is where the waits end.
std::string sink_reason(const StallInput& in, const RankState& rs,
                        const std::vector<std::vector<int>>& out, int rank) {
  if (!rs.root.empty()) return rs.root;
  if (!rs.waiting.empty()) {
    std::vector<std::string> waits;
    for (const WaitReport* w : rs.waiting) {
      waits.push_back(absl::StrCat("its ", w->actor, " waits for ", w->waiting));
    }
    return absl::StrCat(absl::StrJoin(waits, "; "), ", from no known rank");
  }
  std::vector<int> waiters;
  for (int u = 0; u < in.layout.world(); u++) {
    const auto& succ = out[static_cast<std::size_t>(u)];
    if (std::binary_search(succ.begin(), succ.end(), rank)) waiters.push_back(u);
  }
  return absl::StrCat("not waiting for anyone, but rank", waiters.size() > 1 ? "s " : " ",
                      absl::StrJoin(waiters, ", "), waiters.size() > 1 ? " wait" : " waits",
                      " for it");
}

// Every rank that a waiter or a root cause reaches (itself included).
std::vector<bool> reached_from_waiters(const std::vector<RankState>& ranks,
                                       const std::vector<std::vector<int>>& out) {
  std::vector<bool> reached(ranks.size(), false);
  std::deque<int> queue;
  for (std::size_t r = 0; r < ranks.size(); r++) {
    if (!ranks[r].root.empty() || !ranks[r].waiting.empty()) {
      reached[r] = true;
      queue.push_back(static_cast<int>(r));
    }
  }
  for (; !queue.empty(); queue.pop_front()) {
    for (int v : out[static_cast<std::size_t>(queue.front())]) {
      if (!reached[static_cast<std::size_t>(v)]) {
        reached[static_cast<std::size_t>(v)] = true;
        queue.push_back(v);
      }
    }
  }
  return reached;
}

// A component of several ranks with no way out: a cycle through its
// smallest rank `first`, and how many more ranks are caught in it.
Culprit cycle_culprit(const std::vector<std::vector<int>>& out, const std::vector<int>& comp,
                      int first, int members) {
  Culprit c{.ranks = cycle_through(out, comp, first), .cycle = true, .text = ""};
  std::vector<std::string> hops;
  for (int r : c.ranks) hops.push_back(absl::StrCat("rank ", r));
  c.text = absl::StrCat("likely culprit: wait-for cycle: ", absl::StrJoin(hops, " -> "));
  c.ranks.pop_back();  // the members in cycle order, the first not repeated
  if (static_cast<int>(c.ranks.size()) < members) {
    absl::StrAppend(&c.text, " (", members, " ranks wait on each other)");
  }
  return c;
}

}  // namespace

StallAnalysis analyze_stall(const StallInput& in) {
  const std::vector<RankState> ranks = index_ranks(in);
  const std::vector<std::vector<int>> out = wait_for_graph(in, ranks);
  const std::vector<int> comp = components(out);
  const Describer say(in);
  StallAnalysis a;
  a.table = render_table(in, table_rows(in, ranks, say));
  const std::vector<bool> reached = reached_from_waiters(ranks, out);
  // A reached component with no edge out is where waits end. Ranks are
  // visited in order, so a component is named by its smallest rank.
  const int n = in.layout.world();
  std::vector<int> members(static_cast<std::size_t>(n), 0);
  std::vector<bool> exits(static_cast<std::size_t>(n), false);
  std::vector<bool> named(static_cast<std::size_t>(n), false);
  for (int u = 0; u < n; u++) {
    const auto k = static_cast<std::size_t>(comp[static_cast<std::size_t>(u)]);
    members[k]++;
    for (int v : out[static_cast<std::size_t>(u)]) {
      if (comp[static_cast<std::size_t>(v)] != static_cast<int>(k)) exits[k] = true;
    }
  }
  for (int u = 0; u < n; u++) {
    const auto k = static_cast<std::size_t>(comp[static_cast<std::size_t>(u)]);
    if (!reached[static_cast<std::size_t>(u)] || exits[k] || named[k]) continue;
    named[k] = true;
    if (members[k] > 1) {
      a.culprits.push_back(cycle_culprit(out, comp, u, members[k]));
      continue;
    }
    a.culprits.push_back(
        {.ranks = {u},
         .cycle = false,
         .text = absl::StrCat("likely culprit: ", say.who(u), ": ",
                              sink_reason(in, ranks[static_cast<std::size_t>(u)], out, u))});
  }
  return a;
}

std::string StallAnalysis::text() const {
  if (table.empty() && culprits.empty()) return " (nothing reported)";
  std::string s = table.empty() ? "" : absl::StrCat("\n", table);
  for (const Culprit& c : culprits) absl::StrAppend(&s, "\n  ", c.text);
  return s;
}

}  // namespace troupe::actors
