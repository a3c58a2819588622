// The critical path of a step (launcher/trace/summary.h: critical_path).
//
// Walks back from the compute op that finished last. An op started when
// both its stream was free and its input had arrived, so what held it back
// is whichever of the two came later: the previous op on its stream (when
// that ended after the input arrived) or the message that carried its
// input (an activation for a forward, a gradient for a backward, of its
// micro-batch), which leads on to the op whose end posted that send. The
// walk stops at the step's first op.
#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/trace/summary.h"

namespace troupe::launcher::trace {
namespace {

// Timestamps of one rank compare exactly, but the recorder stamps an
// event's end after the callback that reports it, so an op can seem to
// begin a little before the arrival or the op that released it ended.
constexpr std::int64_t kSlackNs = InputIndex::kSlackNs;

struct OpRef {
  int rank_index = -1;  // into Trace::ranks
  int index = -1;
};

const Event& ev(const Trace& t, OpRef r) {
  return t.ranks[static_cast<std::size_t>(r.rank_index)].events[static_cast<std::size_t>(r.index)];
}

// The op of `step` on ranks[ri] that ended last at or before `before`
// (+ slack), other than `not_this`.
std::optional<OpRef> last_op_before(const Trace& t, int ri, int step, std::int64_t before,
                                    int not_this) {
  std::optional<OpRef> best;
  const std::vector<Event>& events = t.ranks[static_cast<std::size_t>(ri)].events;
  for (int i = 0; i < static_cast<int>(events.size()); i++) {
    const Event& e = events[static_cast<std::size_t>(i)];
    if (i == not_this || !training_op(e, step) || e.e > before + kSlackNs) continue;
    if (!best || e.e > ev(t, *best).e) best = OpRef{ri, i};
  }
  return best;
}

std::string op_text(const Trace& t, OpRef r) {
  const Event& e = ev(t, r);
  return absl::StrCat(kind_name(e.kind), " mb ", e.mb,
                      e.chunk > 0 ? absl::StrCat(" chunk ", e.chunk) : "", " on ",
                      t.ranks[static_cast<std::size_t>(r.rank_index)].header.describe());
}

}  // namespace

std::vector<PathStep> critical_path(const Trace& t, const std::vector<Message>& ms, int step) {
  std::optional<OpRef> cur;
  for (int ri = 0; ri < static_cast<int>(t.ranks.size()); ri++) {
    std::optional<OpRef> last =
        last_op_before(t, ri, step, std::numeric_limits<std::int64_t>::max() - kSlackNs, -1);
    if (last && (!cur || ev(t, *last).e > ev(t, *cur).e)) cur = last;
  }
  const InputIndex inputs(t, ms);
  std::vector<PathStep> path;
  std::size_t guard = 0;
  for (const RankTrace& r : t.ranks) guard += r.events.size();
  while (cur && guard-- > 0) {
    const Event& op = ev(t, *cur);
    path.push_back({op_text(t, *cur), op.b, op.duration(), false});
    std::optional<OpRef> prev = last_op_before(t, cur->rank_index, step, op.b, cur->index);
    const Message* m = inputs.input_of(cur->rank_index, op);
    if (m != nullptr && (!prev || event_of(t, *m->recv).e > ev(t, *prev).e)) {
      const Event& s = event_of(t, *m->send);
      const Event& r = event_of(t, *m->recv);
      path.push_back({absl::StrFormat("%s mb %d: rank %d -> rank %d", s.msg, s.mb, m->from, m->to),
                      s.b, r.e - s.b, true});
      cur = last_op_before(t, m->send->rank, step, s.b, -1);
    } else {
      cur = prev;
    }
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace troupe::launcher::trace
