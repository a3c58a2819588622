// Discrete-event simulation of one step (see launcher/plan/sim.h).
#include "launcher/plan/sim.h"

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>

#include "actors/partition.h"
#include "actors/schedule.h"

namespace troupe::launcher::plan {

namespace {

using actors::OpKind;
using actors::ScheduleOp;

struct Event {
  double time = 0;
  long seq = 0;  // ties in time: first scheduled, first handled
  enum class Kind { kOpDone, kArrival } kind = Kind::kOpDone;
  int stage = 0;
  int index = 0;  // kArrival: slot in the stage's arrival table
  bool operator>(const Event& o) const { return std::tie(time, seq) > std::tie(o.time, o.seq); }
};

struct Stage {
  std::vector<ScheduleOp> ops;
  std::vector<const ChunkCost*> chunk;           // by chunk
  std::vector<int> last_backward;                // op index of each chunk's last backward
  std::vector<double> fwd_arrival, bwd_arrival;  // by chunk * m + micro; < 0: not yet
  std::vector<double> fwd_transfer, bwd_transfer;
  std::size_t next = 0;
  bool running = false;
  double free_at = 0;
  double busy = 0, tp = 0, p2p_exposed = 0;
  double dp_free = 0;  // the stage's DP link
  double owned = 0;    // elements its partitions own
};

class Simulation {
 public:
  Simulation(const PlanInput& in, const Costs& cost, bool record)
      : in_(in), cost_(cost), record_(record) {}

  absl::StatusOr<SimResult> run();

 private:
  absl::Status build();
  void push(double time, Event::Kind kind, int stage, int index) {
    queue_.push({time, seq_++, kind, stage, index});
  }
  void try_fire(int s, double now);
  void op_done(int s, double now);

  const PlanInput& in_;
  const Costs& cost_;
  bool record_;
  int pp_ = 1, v_ = 1, m_ = 1;
  std::vector<Stage> stages_;
  std::map<std::tuple<bool, bool, int>, ChunkCost> costs_;  // by (embedding, head, layers)
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  long seq_ = 0;
  SimResult out_;
};

absl::Status Simulation::build() {
  const actors::ParallelOptions& par = in_.parallel;
  pp_ = par.pp;
  v_ = par.virtual_stages;
  m_ = in_.m();
  const model::GptConfig sliced = par.sliced_config(in_.model);
  const comm::Layout shape = par.layout();
  stages_.resize(static_cast<std::size_t>(pp_));
  for (int s = 0; s < pp_; s++) {
    Stage& st = stages_[static_cast<std::size_t>(s)];
    absl::StatusOr<std::vector<ScheduleOp>> ops =
        actors::make_schedule(par.schedule, pp_, s, m_, v_);
    if (!ops.ok()) return ops.status();
    st.ops = *std::move(ops);
    st.last_backward.assign(static_cast<std::size_t>(v_), -1);
    for (std::size_t i = 0; i < st.ops.size(); i++) {
      if (st.ops[i].kind == OpKind::kBackward) {
        st.last_backward[static_cast<std::size_t>(st.ops[i].chunk)] = static_cast<int>(i);
      }
    }
    for (int c = 0; c < v_; c++) {
      const model::StageSpec spec = actors::chunk_spec(sliced, shape, shape.virtual_stage(s, c));
      const auto key = std::make_tuple(spec.embedding, spec.head, spec.layers());
      auto it = costs_.find(key);
      if (it == costs_.end()) it = costs_.emplace(key, cost_.chunk(spec)).first;
      st.chunk.push_back(&it->second);
      st.owned += it->second.owned_elements;
    }
    const std::size_t n = static_cast<std::size_t>(v_ * m_);
    st.fwd_arrival.assign(n, -1);
    st.bwd_arrival.assign(n, -1);
    st.fwd_transfer.assign(n, 0);
    st.bwd_transfer.assign(n, 0);
  }
  return absl::OkStatus();
}

void Simulation::try_fire(int s, double now) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  if (st.running || st.next >= st.ops.size()) return;
  const ScheduleOp& op = st.ops[st.next];
  const int vs = op.chunk * pp_ + s;
  const std::size_t slot = static_cast<std::size_t>(op.chunk * m_ + op.micro);
  const bool forward = op.kind == OpKind::kForward;
  const bool needs_input = forward ? vs > 0 : vs < pp_ * v_ - 1;
  double transfer = 0;
  if (needs_input) {
    const double arrived = forward ? st.fwd_arrival[slot] : st.bwd_arrival[slot];
    if (arrived < 0) return;  // fires when it arrives
    transfer = forward ? st.fwd_transfer[slot] : st.bwd_transfer[slot];
  }
  // The wait beyond the stage's last op that the message's flight caused.
  const double idle = now - st.free_at;
  if (needs_input && idle > 0) st.p2p_exposed += std::min(idle, transfer);
  const ChunkCost& c = *st.chunk[static_cast<std::size_t>(op.chunk)];
  const double dur = forward ? c.fwd : c.bwd;
  st.busy += dur;
  st.tp += forward ? c.tp_fwd : c.tp_bwd;
  st.running = true;
  if (record_) out_.ops.push_back({s, op.chunk, op.micro, !forward, now, now + dur});
  push(now + dur, Event::Kind::kOpDone, s, static_cast<int>(st.next));
}

void Simulation::op_done(int s, double now) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  const std::size_t index = st.next;
  const ScheduleOp& op = st.ops[index];
  const bool forward = op.kind == OpKind::kForward;
  const int vs = op.chunk * pp_ + s;
  const ChunkCost& c = *st.chunk[static_cast<std::size_t>(op.chunk)];
  st.running = false;
  st.free_at = now;
  st.next++;
  // The output leaves at once: to virtual stage vs + 1 (activation) or vs - 1 (gradient).
  const int to_vs = forward ? vs + 1 : vs - 1;
  if (to_vs >= 0 && to_vs < pp_ * v_) {
    const int to = to_vs % pp_;
    const double hop = cost_.p2p_seconds(s, to);
    Stage& dst = stages_[static_cast<std::size_t>(to)];
    const std::size_t slot = static_cast<std::size_t>((to_vs / pp_) * m_ + op.micro);
    (forward ? dst.fwd_transfer : dst.bwd_transfer)[slot] = hop;
    push(now + hop, Event::Kind::kArrival, to, static_cast<int>(slot) * 2 + (forward ? 0 : 1));
    if (record_) out_.messages.push_back({s, to, !forward, now, now + hop});
  }
  // The chunk's last backward: each bucket to the DP reduction as it is final.
  if (!forward && st.last_backward[static_cast<std::size_t>(op.chunk)] == static_cast<int>(index)) {
    const double begin = now - c.bwd;
    for (const ChunkCost::Bucket& b : c.buckets) {
      st.dp_free = std::max(st.dp_free, begin + b.at) + cost_.dp_reduce_seconds(b.bytes);
    }
  }
  try_fire(s, now);
}

absl::StatusOr<SimResult> Simulation::run() {
  if (absl::Status st = build(); !st.ok()) return st;
  for (int s = 0; s < pp_; s++) try_fire(s, 0);
  while (!queue_.empty()) {
    const Event e = queue_.top();
    queue_.pop();
    if (e.kind == Event::Kind::kOpDone) {
      op_done(e.stage, e.time);
    } else {
      Stage& st = stages_[static_cast<std::size_t>(e.stage)];
      const std::size_t slot = static_cast<std::size_t>(e.index / 2);
      (e.index % 2 == 0 ? st.fwd_arrival : st.bwd_arrival)[slot] = e.time;
      try_fire(e.stage, e.time);
    }
  }
  double reduced = 0;
  for (int s = 0; s < pp_; s++) {
    const Stage& st = stages_[static_cast<std::size_t>(s)];
    if (st.next != st.ops.size()) {
      return absl::InternalError("plan: the simulated schedule deadlocked");  // make_schedule's bug
    }
    out_.pipeline_s = std::max(out_.pipeline_s, st.free_at);
    reduced = std::max({reduced, st.dp_free, st.free_at});
  }
  // The global norm waits for every partition; then each steps and sends
  // its parameters back.
  double busy_sum = 0, worst = -1;
  const int dp = in_.parallel.dp;
  for (int s = 0; s < pp_; s++) {
    const Stage& st = stages_[static_cast<std::size_t>(s)];
    const double opt = cost_.optimizer_seconds(st.owned / dp);
    const double gather = cost_.dp_gather_seconds(st.owned * element_bytes(in_.precision));
    const double end = reduced + opt + gather;
    out_.step_s = std::max(out_.step_s, end);
    busy_sum += st.busy;
    out_.busy_s.push_back(st.busy);
    out_.chunks.emplace_back();
    for (const ChunkCost* c : st.chunk)
      out_.chunks.back().push_back({c->fwd, c->bwd, c->tp_fwd, c->tp_bwd});
    double dp_exposed = std::max(0.0, st.dp_free - st.free_at) + gather;
    if (dp_exposed < 1e-12 * out_.step_s) dp_exposed = 0;  // rounding, not time
    const double exposed = st.tp + st.p2p_exposed + dp_exposed;
    if (end - st.busy > worst) {  // the stage with the least compute waits the most
      worst = end - st.busy;
      out_.exposed_stage = s;
      out_.exposed_comm_s = exposed;
      out_.tp_comm_s = st.tp;
      out_.p2p_exposed_s = st.p2p_exposed;
      out_.dp_exposed_s = dp_exposed;
      out_.optimizer_s = opt;
    }
  }
  out_.bubble = out_.pipeline_s > 0 ? 1 - busy_sum / pp_ / out_.pipeline_s : 0;
  return out_;
}

}  // namespace

absl::StatusOr<SimResult> simulate(const PlanInput& in, const Costs& cost, bool record) {
  Simulation sim(in, cost, record);
  return sim.run();
}

}  // namespace troupe::launcher::plan
