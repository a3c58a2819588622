// What `troupe trace DIR` prints: per stage and rank, where the time of
// the steps went (compute busy, idle = the bubble, the part of the idle
// time spent waiting on a message already sent), the bytes and messages,
// the measured bubble next to the schedule's theory, the slowest stage and
// the critical path of the last complete step.
//
//   std::vector<trace::Message> ms = trace::match_messages(t);
//   trace::Summary s = trace::summarize(t, ms, /*only_step=*/std::nullopt);
//   std::fputs(s.text().c_str(), stdout);
//
// Definitions (per rank r and step k; all on the coordinator's clock):
//   span(k)      from the first compute op of step k to begin, on any rank,
//                to the last to end: the pipeline's step time;
//   busy(r, k)   the union of r's compute ops (forward, backward) of step
//                k; TP collectives nest inside them and count as busy;
//   idle(r, k)   span(k) - busy(r, k): the bubble, as the theory counts it;
//   comm(r, k)   the part of idle(r, k) that waited on a message already
//                sent: for each op, the part of the gap before it (from
//                the end of r's previous op, or the span's start) during
//                which the activation or gradient carrying its input was
//                in flight (send posted, receive not complete). The rest
//                of the idle time waits on work not yet done elsewhere (or
//                on nothing: the end of the step).
//   bubble(s)    sum of idle / sum of span over the summarized steps and
//                the ranks of stage s; the mean bubble is over stages.
//   theory       (p-1)/(m+p-1) for 1F1B and GPipe, (p-1)/(v*m+p-1) for
//                the interleaved schedule (Megatron, Narayanan et al. 2021);
//                for zb-h1 and zb-auto ZB-H1's (p-1)(F+B-W) of idle in a
//                step of m(F+B+W) plus it (Qi et al. 2024), for zbv and
//                zb-auto on a V (v 2) the V's least, (p-1) chunk forwards,
//                with F, B and W the measured
//                mean op times (W per micro-batch).
// Evaluation forwards are left out (they are not part of a training step).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/trace/files.h"
#include "launcher/trace/messages.h"

namespace troupe::launcher::trace {

// A training step's compute op (not an evaluation's, not left open by a
// stop): what the busy time, the bubble and the critical path count.
bool training_op(const Event& e, int step);

// The training steps every rank's trace holds whole: each rank has the
// step's "step" event closed, and (where its ring dropped events) began it
// after its oldest kept event ended, so none of the step's ops can have
// been overwritten. The others go to *skipped with the reason.
std::vector<int> complete_steps(const Trace& t, std::vector<std::string>* skipped);

struct RankStats {
  int rank = 0;
  std::int64_t busy = 0, idle = 0, comm = 0, span = 0;  // ns, summed over steps
  std::int64_t bytes_sent = 0, bytes_received = 0;
  int sent = 0, received = 0;  // messages of those steps (every kind)
  int ops = 0;
  double bubble() const { return span > 0 ? static_cast<double>(idle) / span : 0; }
};

struct StageStats {
  int stage = 0;
  double busy = 0, idle = 0, comm = 0, span = 0;  // ns per step, mean over its ranks
  double bubble = 0;
};

// One entry of the critical path, in time order.
struct PathStep {
  std::string what;           // "forward mb 3 chunk 0 on rank 1 (0,1,0)" / "activation 0 -> 1 mb 3"
  std::int64_t begin = 0;     // ns, coordinator's clock
  std::int64_t duration = 0;  // ns
  bool message = false;
};

struct Summary {
  const Trace* trace = nullptr;
  std::vector<int> steps;            // summarized
  std::vector<std::string> skipped;  // "step 1: ..." why not
  std::vector<RankStats> ranks;      // in stage, d, t order
  std::vector<StageStats> stages;
  double mean_bubble = 0, theory = 0;
  std::string theory_formula;  // "(p-1)/(m+p-1) = 3/11"
  int slowest_stage = -1;      // the most busy per step
  double slowest_excess = 0;   // its busy / the least busy stage's - 1
  // A stage stands out only above 1%: else the stages are equally loaded.
  bool has_slowest() const { return slowest_stage >= 0 && slowest_excess > 0.01; }
  int path_step = -1;  // the step of the critical path
  std::int64_t path_span = 0;
  std::vector<PathStep> critical_path;
  int matched = 0, unmatched = 0;

  std::string text() const;
};

// only_step: summarize that step alone (an error text in skipped when it is
// not complete).
Summary summarize(const Trace& t, const std::vector<Message>& ms, std::optional<int> only_step);

// Interval arithmetic on [b, e) ns, used above and by the tests.
using Interval = std::pair<std::int64_t, std::int64_t>;
std::vector<Interval> union_of(std::vector<Interval> v);
std::int64_t length(const std::vector<Interval>& v);
std::int64_t overlap(const std::vector<Interval>& a,
                     const std::vector<Interval>& b);  // both unions
// span(k): [first begin, last end] of step k's training compute ops, any rank.
Interval step_bounds(const Trace& t, int k);
// Micro-batches of step k's schedule, as its step record says (a ramped-up
// step has fewer than the header's m, the full batch's), else the header's.
int step_micro_batches(const Trace& t, int k);

// The critical path of step k (summarize's, exposed for tests): from the
// compute op that finished last, back through the previous op on its
// stream when that ended after the op's input arrived, else through the
// message whose arrival released it to the op that sent it.
std::vector<PathStep> critical_path(const Trace& t, const std::vector<Message>& ms, int step);

}  // namespace troupe::launcher::trace
