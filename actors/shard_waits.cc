// ShardActor's waits: what it waits for (its trace events and the stall
// watchdog's reports), and its ops' names.
#include "absl/strings/str_cat.h"
#include "actors/shard_actor.h"

namespace troupe::actors {

using comm::MessageKind;
namespace trace = comm::trace;

void ShardActor::wait_for(const ScheduleOp* op, std::string what, int peer, trace::What kind) {
  const int op_id = op != nullptr ? op->id : -1;
  if (op_id == wait_op_ && what == wait_what_) return;  // still the same wait
  wait_op_ = op_id;
  wait_what_ = std::move(what);
  wait_peer_ = peer;
  wait_since_ = std::chrono::steady_clock::now();
  end_trace_wait();
  if (kind != trace::What::kNone && setup_.trace != nullptr && setup_.trace->recorder != nullptr) {
    trace::Event e;
    e.kind = trace::Kind::kWait;
    e.what = kind;
    e.step = step_;
    e.peer = peer;
    if (op != nullptr) {
      e.micro = op->micro;
      e.chunk = op->chunk;
    }
    trace_wait_ = setup_.trace->recorder->open(e);
  }
}

// The wait that was open ended (its op fired, or the step is done).
void ShardActor::end_trace_wait() {
  if (trace_wait_ == trace::Recorder::kNone) return;
  setup_.trace->recorder->close(trace_wait_);
  trace_wait_ = trace::Recorder::kNone;
}

trace::Event ShardActor::op_event(const ScheduleOp& op) const {
  trace::Event e;
  e.kind = op.kind == OpKind::kForward    ? trace::Kind::kForward
           : op.kind == OpKind::kBackward ? trace::Kind::kBackward
                                          : trace::Kind::kWeight;
  e.step = step_;
  e.micro = op.micro;
  e.chunk = op.chunk;
  e.layer = setup_.shape.virtual_stage(setup_.coord.s, op.chunk);
  e.eval = pass_ == Pass::kEval ? 1 : 0;
  return e;
}

WaitReport ShardActor::report() const {
  WaitReport r;
  r.rank = setup_.rank;
  r.actor = absl::StrCat("shard d=", setup_.coord.d, " s=", setup_.coord.s);
  r.step = step_;
  r.op_id = wait_op_;
  if (wait_op_ >= 0) r.op = describe((*ops_)[static_cast<std::size_t>(wait_op_)]);
  r.waiting = step_ > 0 ? wait_what_ : "";
  r.peer = wait_peer_;
  r.since_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_since_).count();
  r.progress = progress_;
  // Ops complete in the order they fired (one stream): the oldest of those
  // fired and not done is the first of fired_.
  if (step_ > 0 && !fired_.empty()) {
    const ScheduleOp& oldest = (*ops_)[static_cast<std::size_t>(fired_.front().op_id)];
    r.computing = describe(oldest);
    // Its stream waits for its input from a link: the wait is for the peer.
    if (auto it = ahead_waits_.find(oldest.id); it != ahead_waits_.end() && !it->second.there()) {
      const AheadWait& w = it->second;
      r.computing.clear();
      r.op_id = oldest.id;
      r.op = describe(oldest);
      r.waiting =
          absl::StrCat(w.kind == MessageKind::kActivation ? "the activation" : "the gradient",
                       " from rank ", w.from, w.link ? " (in its pipeline link)" : "");
      r.peer = w.from;
      r.since_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w.since).count();
    }
  }
  return r;
}

std::string ShardActor::describe(const ScheduleOp& op) const {
  const bool split = splits_backward(setup_.schedule);
  const char* what = op.kind == OpKind::kForward  ? "forward"
                     : op.kind == OpKind::kWeight ? "weight gradients (W)"
                     : split                      ? "input gradient (B)"
                                                  : "backward";
  return absl::StrCat(what, " of micro-batch ", op.micro, " (chunk ", op.chunk, ")");
}

}  // namespace troupe::actors
