// Discrete-event simulation of one step (see launcher/plan/sim.h).
#include "launcher/plan/sim.h"

#include <algorithm>
#include <deque>
#include <map>
#include <queue>
#include <tuple>

#include "actors/partition.h"
#include "actors/rank/rank.h"
#include "actors/schedule.h"

namespace troupe::launcher::plan {

namespace {

using actors::OpKind;
using actors::ScheduleOp;

struct Event {
  double time = 0;
  long seq = 0;  // ties in time: first scheduled, first handled
  enum class Kind { kOpDone, kArrival, kRecheck, kSent } kind = Kind::kOpDone;
  int stage = 0;
  int index = 0;  // kArrival, kSent: the message's key(); kOpDone, kRecheck: an op's index
  bool operator>(const Event& o) const { return std::tie(time, seq) > std::tie(o.time, o.seq); }
};

// A message into a stage: its slot (chunk x m + micro-batch) and direction.
int key(std::size_t slot, bool forward) { return static_cast<int>(slot) * 2 + (forward ? 0 : 1); }

struct Stage {
  std::vector<ScheduleOp> ops;
  std::vector<const ChunkCost*> chunk;           // by chunk
  std::vector<int> last_backward;                // op index of each chunk's last backward (or W)
  std::vector<double> fwd_arrival, bwd_arrival;  // by chunk * m + micro; < 0: not yet
  std::vector<double> fwd_transfer, bwd_transfer;
  // Blocking p2p (PlanInput::blocking_p2p), by slot: whether the message's
  // sender has posted it, from which stage, and whether this stage has
  // posted its receive (the message goes when both have); and this stage's
  // own sends not yet through.
  std::vector<char> fwd_sent, bwd_sent, fwd_posted, bwd_posted;
  std::vector<int> fwd_from, bwd_from;
  int sends_open = 0;
  std::size_t next = 0;
  bool running = false;
  double free_at = 0;
  double busy = 0, tp = 0, p2p_exposed = 0;
  double dp_free = 0;  // the stage's DP link
  double owned = 0;    // elements its partitions own
  // zb-auto: the W's whose B has run (op index, pieces done), the stash
  // cap per chunk, what the running op is (a W piece: its op index and whether it is
  // the W's last), and the measured input gaps (by op index; < 0: none).
  struct Pending {
    int op = 0, done = 0;
  };
  std::deque<Pending> pending;
  std::vector<int> cap;
  int piece_op = -1;
  bool piece_last = false;
  int dry_op = -1;
  double dry_since = 0;
  int recheck_op = -1, overdue_op = -1;  // a recheck asked for, and come
  std::vector<double> gap;
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
  // zb-auto's rule at stage s, now free; true when it started an op.
  bool auto_fire(int s, double now);
  void start(int s, double now, double dur, int index, const ScheduleOp& op, bool weight);
  // Blocking p2p: stage s, between ops, posts the receives of its next
  // forward's and next backward's inputs; a message both sides have posted
  // goes at `now`.
  void post_receives(int s, double now);
  // Blocking p2p: stage s, its op done, posts its output's message to
  // stage `to`; and the message goes (both sides have posted).
  void post_send(int s, int to, int k, double now);
  void begin_transfer(int to, int k, double now);
  // A blocking sender's message is through: it may go on.
  void sent(int s, double now);

 public:
  // zb-auto: the input gaps a previous pass measured (per stage, by op).
  std::vector<std::vector<double>> measured;
  std::vector<std::vector<double>> gaps() const {
    std::vector<std::vector<double>> out;
    for (const Stage& st : stages_) out.push_back(st.gap);
    return out;
  }

 private:
  const PlanInput& in_;
  const Costs& cost_;
  bool record_;
  bool split_ = false, automatic_ = false, blocking_ = false;
  comm::Layout shape_;
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
  split_ = actors::splits_backward(par.schedule);
  automatic_ = par.schedule == actors::ScheduleKind::kZbAuto;
  blocking_ = in_.blocking_p2p && !automatic_;
  const model::GptConfig sliced = par.sliced_config(in_.model);
  const comm::Layout shape = par.layout();
  shape_ = shape;
  stages_.resize(static_cast<std::size_t>(pp_));
  for (int s = 0; s < pp_; s++) {
    Stage& st = stages_[static_cast<std::size_t>(s)];
    absl::StatusOr<std::vector<ScheduleOp>> ops =
        actors::make_schedule(par.schedule, pp_, s, m_, v_);
    if (!ops.ok()) return ops.status();
    st.ops = *std::move(ops);
    st.last_backward.assign(static_cast<std::size_t>(v_), -1);
    const OpKind last = split_ ? OpKind::kWeight : OpKind::kBackward;
    for (std::size_t i = 0; i < st.ops.size(); i++) {
      if (st.ops[i].kind == last) {
        st.last_backward[static_cast<std::size_t>(st.ops[i].chunk)] = static_cast<int>(i);
      }
    }
    for (int c = 0; c < v_; c++) st.cap.push_back(std::max(1, actors::stashes_for(par, st.ops, c)));
    st.gap.assign(st.ops.size(), -1);
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
    st.fwd_sent.assign(n, 0);
    st.bwd_sent.assign(n, 0);
    st.fwd_from.assign(n, -1);
    st.bwd_from.assign(n, -1);
    st.fwd_posted.assign(n, 0);
    st.bwd_posted.assign(n, 0);
  }
  return absl::OkStatus();
}

// Of each model chunk, the next forward's and the next backward's: as
// non-blocking receives posted ahead would be. (Megatron pairs them with its
// sends -- send_forward_recv_backward, the interleaved schedule's
// send_forward_backward_recv_forward_backward -- which posts fewer at a
// time; one receive of each kind in all deadlocks ZB-V's two chunks.)
void Simulation::post_receives(int s, double now) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  std::vector<char> seen(static_cast<std::size_t>(2 * v_), 0);
  int left = 2 * v_;
  for (std::size_t i = st.next; i < st.ops.size() && left > 0; i++) {
    const ScheduleOp& op = st.ops[i];
    if (op.kind == OpKind::kWeight) continue;
    const bool forward = op.kind == OpKind::kForward;
    char& first = seen[static_cast<std::size_t>(2 * op.chunk + (forward ? 0 : 1))];
    if (first) continue;
    first = 1;
    left--;
    const int vs = shape_.virtual_stage(s, op.chunk);
    if (forward ? vs == 0 : vs == pp_ * v_ - 1) continue;  // no input
    const std::size_t slot = static_cast<std::size_t>(op.chunk * m_ + op.micro);
    char& posted = (forward ? st.fwd_posted : st.bwd_posted)[slot];
    if (posted) continue;
    posted = 1;
    if ((forward ? st.fwd_sent : st.bwd_sent)[slot]) begin_transfer(s, key(slot, forward), now);
  }
}

void Simulation::post_send(int s, int to, int k, double now) {
  Stage& dst = stages_[static_cast<std::size_t>(to)];
  const std::size_t slot = static_cast<std::size_t>(k / 2);
  const bool forward = k % 2 == 0;
  (forward ? dst.fwd_sent : dst.bwd_sent)[slot] = 1;
  (forward ? dst.fwd_from : dst.bwd_from)[slot] = s;
  stages_[static_cast<std::size_t>(s)].sends_open++;
  if ((forward ? dst.fwd_posted : dst.bwd_posted)[slot]) begin_transfer(to, k, now);
}

// The message goes now: it is there a hop later, and its sender free of it
// when the bytes have come (the receivers' own all-gather is theirs).
void Simulation::begin_transfer(int to, int k, double now) {
  Stage& dst = stages_[static_cast<std::size_t>(to)];
  const std::size_t slot = static_cast<std::size_t>(k / 2);
  const bool forward = k % 2 == 0;
  const double hop = (forward ? dst.fwd_transfer : dst.bwd_transfer)[slot];
  const int from = (forward ? dst.fwd_from : dst.bwd_from)[slot];
  push(now + hop, Event::Kind::kArrival, to, k);
  push(now + hop - cost_.p2p_gather_seconds(), Event::Kind::kSent, from, k);
  if (record_) out_.messages.push_back({from, to, !forward, now, now + hop});
}

// The time it was held past its op's end counts as exposed point-to-point.
void Simulation::sent(int s, double now) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  st.sends_open--;
  if (st.sends_open == 0 && !st.running && now > st.free_at) {
    st.p2p_exposed += now - st.free_at;
    st.free_at = now;
  }
  try_fire(s, now);
}

void Simulation::start(int s, double now, double dur, int index, const ScheduleOp& op,
                       bool weight) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  const ChunkCost& c = *st.chunk[static_cast<std::size_t>(op.chunk)];
  st.busy += dur;
  if (op.kind == OpKind::kForward) st.tp += c.tp_fwd;
  if (op.kind == OpKind::kBackward) st.tp += c.tp_bwd;
  st.running = true;
  if (record_) {
    out_.ops.push_back(
        {s, op.chunk, op.micro, op.kind != OpKind::kForward, weight, now, now + dur});
  }
  push(now + dur, Event::Kind::kOpDone, s, index);
}

void Simulation::try_fire(int s, double now) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  if (st.running) return;
  if (automatic_) {
    auto_fire(s, now);
    return;
  }
  if (st.next >= st.ops.size()) return;
  const ScheduleOp& op = st.ops[st.next];
  const ChunkCost& c = *st.chunk[static_cast<std::size_t>(op.chunk)];
  if (blocking_) post_receives(s, now);
  if (op.kind == OpKind::kWeight) {
    if (blocking_ && st.sends_open > 0) return;
    start(s, now, c.bwd_w, static_cast<int>(st.next), op, true);
    return;
  }
  const int vs = shape_.virtual_stage(s, op.chunk);
  const std::size_t slot = static_cast<std::size_t>(op.chunk * m_ + op.micro);
  const bool forward = op.kind == OpKind::kForward;
  const bool needs_input = forward ? vs > 0 : vs < pp_ * v_ - 1;
  double transfer = 0;
  if (needs_input) {
    const double arrived = forward ? st.fwd_arrival[slot] : st.bwd_arrival[slot];
    if (arrived < 0) return;  // fires when it arrives
    transfer = forward ? st.fwd_transfer[slot] : st.bwd_transfer[slot];
  }
  if (blocking_ && st.sends_open > 0) return;  // fires when they are through
  // The wait beyond the stage's last op that the message's flight caused.
  const double idle = now - st.free_at;
  if (needs_input && idle > 0) st.p2p_exposed += std::min(idle, transfer);
  const double dur = forward ? c.fwd : split_ ? c.bwd - c.bwd_w : c.bwd;
  start(s, now, dur, static_cast<int>(st.next), op, false);
}

bool Simulation::auto_fire(int s, double now) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  while (st.next < st.ops.size() && st.ops[st.next].kind == OpKind::kWeight) st.next++;
  auto piece = [&](bool whole) {
    Stage::Pending& w = st.pending.front();
    const ScheduleOp& op = st.ops[static_cast<std::size_t>(w.op)];
    const ChunkCost& c = *st.chunk[static_cast<std::size_t>(op.chunk)];
    const int n = whole ? c.w_pieces - w.done : 1;
    w.done += n;
    st.piece_op = w.op;
    st.piece_last = w.done == c.w_pieces;
    if (st.piece_last) st.pending.pop_front();
    start(s, now, c.bwd_w * n / c.w_pieces, w.op, op, true);
    return true;
  };
  if (st.next >= st.ops.size()) return !st.pending.empty() && piece(true);  // drain
  const ScheduleOp& op = st.ops[st.next];
  const ChunkCost& c = *st.chunk[static_cast<std::size_t>(op.chunk)];
  const int vs = shape_.virtual_stage(s, op.chunk);
  const std::size_t slot = static_cast<std::size_t>(op.chunk * m_ + op.micro);
  const bool forward = op.kind == OpKind::kForward;
  const bool needs_input = forward ? vs > 0 : vs < pp_ * v_ - 1;
  const double arrived = !needs_input ? 0 : forward ? st.fwd_arrival[slot] : st.bwd_arrival[slot];
  // Whether the next B's chunk has all its stashes held: a W must run
  // before that B whatever happens.
  auto stashes_held = [&] {
    std::size_t i = st.next;
    while (i < st.ops.size() && st.ops[i].kind != OpKind::kBackward) i++;
    if (i == st.ops.size()) return false;
    int held = 0;
    for (const Stage::Pending& w : st.pending) {
      held += st.ops[static_cast<std::size_t>(w.op)].chunk == st.ops[i].chunk ? 1 : 0;
    }
    return held >= st.cap[static_cast<std::size_t>(st.ops[i].chunk)];
  };
  // A B whose chunk's stashes are all held: the oldest W, whole (as the
  // shard does until one of this chunk's is free).
  if (!forward && stashes_held()) return piece(true);
  if (arrived >= 0) {
    if (st.dry_op == static_cast<int>(st.next)) {
      st.gap[st.next] = std::max(0.0, arrived - st.dry_since);
      st.dry_op = -1;
    }
    const double transfer = forward ? st.fwd_transfer[slot] : st.bwd_transfer[slot];
    const double idle = now - st.free_at;
    if (needs_input && idle > 0) st.p2p_exposed += std::min(idle, transfer);
    st.piece_op = -1;
    start(s, now, forward ? c.fwd : c.bwd - c.bwd_w, static_cast<int>(st.next), op, false);
    return true;
  }
  // (The shard notes a dry stream only with a W pending.)
  if (st.pending.empty()) return false;
  if (st.dry_op != static_cast<int>(st.next)) {
    st.dry_op = static_cast<int>(st.next);
    st.dry_since = now;
  }
  // The rule with the first pass's measurements: a piece that would not
  // end before the input is due waits (until the input comes, or is a
  // quarter piece overdue).
  const std::vector<double>* known =
      measured.empty() ? nullptr : &measured[static_cast<std::size_t>(s)];
  if (known != nullptr && (*known)[st.next] >= 0 && !stashes_held()) {
    const ChunkCost& wc = *st.chunk[static_cast<std::size_t>(
        st.ops[static_cast<std::size_t>(st.pending.front().op)].chunk)];
    const double p = wc.bwd_w / wc.w_pieces;
    const double left = (*known)[st.next] - (now - st.dry_since);
    if (left < p && st.overdue_op != static_cast<int>(st.next)) {
      if (st.recheck_op != static_cast<int>(st.next)) {
        st.recheck_op = static_cast<int>(st.next);
        push(now + std::max(0.0, left) + 0.25 * p, Event::Kind::kRecheck, s,
             static_cast<int>(st.next));
      }
      return false;
    }
  }
  return piece(false);
}

void Simulation::op_done(int s, double now) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  st.running = false;
  st.free_at = now;
  if (automatic_ && st.piece_op >= 0) {  // a W piece
    const ScheduleOp& w = st.ops[static_cast<std::size_t>(st.piece_op)];
    const ChunkCost& c = *st.chunk[static_cast<std::size_t>(w.chunk)];
    if (in_.overlap_grad_reduce && st.piece_last &&
        st.last_backward[static_cast<std::size_t>(w.chunk)] == st.piece_op) {
      const double begin = now - c.bwd_w;
      for (const ChunkCost::Bucket& b : c.buckets) {
        st.dp_free = std::max(st.dp_free, begin + b.at / c.bwd * c.bwd_w) +
                     cost_.dp_reduce_seconds(s, b.bytes);
      }
    }
    st.piece_op = -1;
    try_fire(s, now);
    return;
  }
  const std::size_t index = st.next;
  const ScheduleOp& op = st.ops[index];
  const bool forward = op.kind == OpKind::kForward;
  const int vs = shape_.virtual_stage(s, op.chunk);
  const ChunkCost& c = *st.chunk[static_cast<std::size_t>(op.chunk)];
  st.next++;
  if (automatic_ && op.kind == OpKind::kBackward) {
    // Its W, pending (the list's W for this micro-batch).
    for (std::size_t i = index + 1; i < st.ops.size(); i++) {
      if (st.ops[i].kind == OpKind::kWeight && st.ops[i].micro == op.micro &&
          st.ops[i].chunk == op.chunk) {
        st.pending.push_back({static_cast<int>(i), 0});
        break;
      }
    }
  }
  // The output leaves at once (blocking p2p: is posted): to virtual stage
  // vs + 1 (activation) or vs - 1 (gradient).
  const int to_vs = forward ? vs + 1 : vs - 1;
  if (op.kind != OpKind::kWeight && to_vs >= 0 && to_vs < pp_ * v_) {
    const int to = shape_.stage_of(to_vs);
    const double hop = cost_.p2p_seconds(s, to);
    Stage& dst = stages_[static_cast<std::size_t>(to)];
    const std::size_t slot = static_cast<std::size_t>(shape_.chunk_of(to_vs) * m_ + op.micro);
    (forward ? dst.fwd_transfer : dst.bwd_transfer)[slot] = hop;
    if (blocking_) {
      post_send(s, to, key(slot, forward), now);
    } else {
      push(now + hop, Event::Kind::kArrival, to, key(slot, forward));
      if (record_) out_.messages.push_back({s, to, !forward, now, now + hop});
    }
  }
  // The chunk's last backward (split: last W): each bucket to the DP
  // reduction as it is final.
  if (in_.overlap_grad_reduce &&
      st.last_backward[static_cast<std::size_t>(op.chunk)] == static_cast<int>(index)) {
    const double dur = split_ ? c.bwd_w : c.bwd;
    const double begin = now - dur;
    for (const ChunkCost::Bucket& b : c.buckets) {
      st.dp_free =
          std::max(st.dp_free, begin + b.at / c.bwd * dur) + cost_.dp_reduce_seconds(s, b.bytes);
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
    } else if (e.kind == Event::Kind::kSent) {
      sent(e.stage, e.time);
    } else if (e.kind == Event::Kind::kRecheck) {
      Stage& st = stages_[static_cast<std::size_t>(e.stage)];
      if (st.recheck_op == e.index) st.overdue_op = e.index;
      try_fire(e.stage, e.time);
    } else {
      Stage& st = stages_[static_cast<std::size_t>(e.stage)];
      const std::size_t slot = static_cast<std::size_t>(e.index / 2);
      (e.index % 2 == 0 ? st.fwd_arrival : st.bwd_arrival)[slot] = e.time;
      try_fire(e.stage, e.time);
    }
  }
  if (!in_.overlap_grad_reduce) {  // every bucket after the stage's last op
    for (int s = 0; s < pp_; s++) {
      Stage& st = stages_[static_cast<std::size_t>(s)];
      st.dp_free = st.free_at;
      for (const ChunkCost* c : st.chunk) {
        for (const ChunkCost::Bucket& b : c->buckets)
          st.dp_free += cost_.dp_reduce_seconds(s, b.bytes);
      }
    }
  }
  double reduced = 0;
  for (int s = 0; s < pp_; s++) {
    const Stage& st = stages_[static_cast<std::size_t>(s)];
    if (st.next != st.ops.size() || !st.pending.empty()) {
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
    const double gather = cost_.dp_gather_seconds(s, st.owned * element_bytes(in_.precision));
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
  if (in.parallel.schedule != actors::ScheduleKind::kZbAuto) {
    Simulation sim(in, cost, record);
    return sim.run();
  }
  // zb-auto: a greedy pass measures the input gaps, and each further pass
  // uses the latest measurement of each, until they hold still (the
  // runtime's steady state: the shard averages its steps' measurements,
  // whose costs vary; here they are fixed). What one stage learns changes
  // its neighbours' gaps, so it takes about pp passes.
  const int most = 2 * in.parallel.pp + 4;
  std::vector<std::vector<double>> measured;
  for (int pass = 0;; pass++) {
    Simulation sim(in, cost, false);
    sim.measured = measured;
    absl::StatusOr<SimResult> r = sim.run();
    if (!r.ok()) return r;
    std::vector<std::vector<double>> next = sim.gaps();
    for (std::size_t s = 0; s < next.size() && !measured.empty(); s++) {
      for (std::size_t i = 0; i < next[s].size(); i++) {
        if (next[s][i] < 0) next[s][i] = measured[s][i];
      }
    }
    if (next == measured || pass + 1 == most) {
      if (!record) return r;
      Simulation recorded(in, cost, true);
      recorded.measured = measured;
      return recorded.run();
    }
    measured = std::move(next);
  }
}

}  // namespace troupe::launcher::plan
