// ShardActor's ops: a forward, a B (or whole backward) and a W put on the
// stream, zb-auto's choice of W, and an op's output sent from the stream.
#include "absl/strings/str_cat.h"
#include "actors/messages.h"
#include "actors/rank/stream_bridge.h"
#include "actors/shard_actor.h"
#include "model/loss_scale.h"

namespace troupe::actors {

using comm::MessageKind;
namespace trace = comm::trace;

bool ShardActor::auto_weights() {
  if (pending_w_.empty()) return false;
  const bool ended = cursor_ >= ops_->size();
  if (!ended && !stash_wait_) {
    if (!fired_.empty()) return false;  // the stream has work
    note_dry();
    // (A W that must run before the next B anyway runs now, fit or not.)
    if (!next_backward_waits_for_a_stash() && !piece_fits()) return false;
  }
  PendingWeight& w = pending_w_.front();
  const bool single = !ended && !stash_wait_;
  if (fired_.empty() && single) {  // a piece's time on an idle stream
    timed_piece_ = w.op_id;
    piece_since_ = Clock::now();
  }
  const ScheduleOp& op = (*ops_)[static_cast<std::size_t>(w.op_id)];
  const int pieces = setup_.chunks[static_cast<std::size_t>(op.chunk)]->weight_pieces();
  // At the end or for a stash, the whole rest of it; else one piece.
  const int count = ended || stash_wait_ ? pieces - w.next_piece : 1;
  fire_weight(op, w.next_piece, count);
  w.next_piece += count;
  if (w.next_piece == pieces) pending_w_.pop_front();
  stash_wait_ = false;
  return true;
}

bool ShardActor::next_backward_waits_for_a_stash() const {
  for (std::size_t i = cursor_; i < ops_->size(); i++) {
    const ScheduleOp& op = (*ops_)[i];
    if (op.kind != OpKind::kBackward) continue;
    const ChunkState& cs = chunk_[static_cast<std::size_t>(op.chunk)];
    return cs.stash_of[static_cast<std::size_t>(op.micro)] < 0 && cs.free_stashes.empty();
  }
  return false;
}

void ShardActor::note_dry() {
  const int op = (*ops_)[cursor_].id;
  if (dry_op_ == op) return;
  dry_op_ = op;
  dry_since_ = Clock::now();
}

void ShardActor::note_input(int op_id) {
  if (op_id != dry_op_) return;
  const double gap = std::chrono::duration<double, std::milli>(Clock::now() - dry_since_).count();
  double& g = input_gap_ms_[static_cast<std::size_t>(op_id)];
  g = g < 0 ? gap : 0.5 * g + 0.5 * gap;
  dry_op_ = -1;
}

void ShardActor::note_done(int op_id) {
  if (op_id != timed_piece_) return;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - piece_since_).count();
  piece_ms_ = piece_ms_ < 0 ? ms : 0.5 * piece_ms_ + 0.5 * ms;
  timed_piece_ = -1;
}

bool ShardActor::piece_fits() {
  const int op = (*ops_)[cursor_].id;
  const double gap = input_gap_ms_[static_cast<std::size_t>(op)];
  if (gap < 0 || piece_ms_ < 0) return true;  // nothing measured yet: greedy
  const double waited =
      std::chrono::duration<double, std::milli>(Clock::now() - dry_since_).count();
  const double left = gap - waited;
  // Overdue by a quarter piece (its recheck came): the estimate was wrong
  // this time.
  if (left >= piece_ms_ || overdue_op_ == op) return true;
  if (recheck_op_ != op) {
    recheck_op_ = op;
    const double after = std::max(0.0, left) + 0.25 * piece_ms_;
    delayed_send(this, std::chrono::microseconds(static_cast<std::int64_t>(after * 1e3) + 1),
                 recheck_atom::value, step_, op);
  }
  return false;
}

void ShardActor::fire_forward(const ScheduleOp& op, int slot) {
  StageCompute& sc = *setup_.chunks[static_cast<std::size_t>(op.chunk)];
  const Mirrors& mr = mirrors_[static_cast<std::size_t>(op.chunk)];
  const auto j = static_cast<std::size_t>(op.micro);
  const auto k = static_cast<std::size_t>(slot);
  mark_stream(
      setup_.trace, *setup_.stream, op_event(op),
      [&] {
        if (!sc.spec().embedding && setup_.links == nullptr) mr.input[k].to_device(*setup_.stream);
        sc.forward(*setup_.stream, slot, tokens_.empty() ? gpu::Tensor{} : tokens_[j].device(),
                   targets_.empty() ? gpu::Tensor{} : targets_[j].device());
        if (sc.spec().head) mr.losses[k].to_host(*setup_.stream);  // read at op_done
      },
      /*set_current=*/true);
  if (!sc.spec().head) stream_send(MessageKind::kActivation, op, slot);
  fired_.push_back({op.id, true});
  send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                 caf::make_message(op_done_atom::value, op.id));
}

// Each bucket of `chunk` leaves as soon as the stream is past its point.
model::GradProgress ShardActor::bucket_progress(int chunk) {
  return [this, c = chunk](model::GradPoint point) {
    const auto& buckets = chunk_[static_cast<std::size_t>(c)].buckets;
    for (int b = 0; b < static_cast<int>(buckets.size()); b++) {
      const GradBucket& bucket = buckets[static_cast<std::size_t>(b)];
      if (bucket.ready != point) continue;
      if (pieces_on_device() && !reduce_bucket(c, b)) continue;  // nothing tied in it
      mirrors_[static_cast<std::size_t>(c)].grads.to_host(*setup_.stream, bucket.range.begin,
                                                          bucket.range.size());
      send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                     caf::make_message(bucket_atom::value, step_, c, b));
    }
  };
}

void ShardActor::fire_backward(const ScheduleOp& op, int slot) {
  ChunkState& cs = chunk_[static_cast<std::size_t>(op.chunk)];
  StageCompute& sc = *setup_.chunks[static_cast<std::size_t>(op.chunk)];
  const Mirrors& mr = mirrors_[static_cast<std::size_t>(op.chunk)];
  const auto j = static_cast<std::size_t>(op.micro);
  const auto k = static_cast<std::size_t>(slot);
  const bool split = splits_backward(setup_.schedule);
  // The step's last backward of this chunk finishes its gradients (split:
  // its last W does).
  model::GradProgress progress;
  const bool finishes = ++cs.backwards_fired == m_;
  if (finishes && !split) progress = bucket_progress(op.chunk);
  const float dloss =
      model::token_loss_weight(static_cast<std::int64_t>(global_batch_) * setup_.T, loss_scale_);
  const gpu::Tensor tokens = tokens_.empty() ? gpu::Tensor{} : tokens_[j].device();
  const gpu::Tensor targets = targets_.empty() ? gpu::Tensor{} : targets_[j].device();
  mark_stream(
      setup_.trace, *setup_.stream, op_event(op),
      [&] {
        if (!sc.spec().head && setup_.links == nullptr) {
          mr.output_grad[k].to_device(*setup_.stream);
        }
        if (split) {
          sc.backward_input(*setup_.stream, slot, cs.stash_of[j], tokens, targets, dloss, finishes);
        } else {
          sc.backward(*setup_.stream, slot, tokens, targets, dloss, progress, finishes);
        }
      },
      /*set_current=*/true);
  if (!sc.spec().embedding) stream_send(MessageKind::kGradient, op, slot);
  fired_.push_back({op.id, true});
  send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                 caf::make_message(op_done_atom::value, op.id));
  if (split && setup_.schedule == ScheduleKind::kZbAuto) {
    pending_w_.push_back({weight_op_[static_cast<std::size_t>(op.chunk * m_ + op.micro)], 0});
  }
}

void ShardActor::fire_weight(const ScheduleOp& op, int first, int count) {
  ChunkState& cs = chunk_[static_cast<std::size_t>(op.chunk)];
  StageCompute& sc = *setup_.chunks[static_cast<std::size_t>(op.chunk)];
  const int pieces = sc.weight_pieces();
  if (count < 0) count = pieces - first;
  const bool last = first + count == pieces;
  // Every piece of the chunk's last W (W's fire in micro-batch order, one
  // whole before the next) reports its buckets.
  model::GradProgress progress;
  if (cs.weights_fired == m_ - 1) progress = bucket_progress(op.chunk);
  if (last) cs.weights_fired++;
  int& stash = cs.stash_of[static_cast<std::size_t>(op.micro)];
  mark_stream(
      setup_.trace, *setup_.stream, op_event(op),
      [&] { sc.backward_weight(*setup_.stream, stash, first, count, progress); },
      /*set_current=*/true);
  if (last) {
    // Free for any op after this one on the stream.
    cs.free_stashes.push_back(stash);
    stash = -1;
  }
  fired_.push_back({op.id, last});
  send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                 caf::make_message(op_done_atom::value, op.id));
}

// The op's output leaves from the stream itself, right behind the op (and
// its copy to the host), not after a round trip through this actor's
// mailbox; the slot stays held until the bytes have left. The callback
// calls the transport on host memory only: no device call runs in it.
void ShardActor::stream_send(MessageKind kind, const ScheduleOp& op, int slot) {
  const int vs = setup_.shape.virtual_stage(setup_.coord.s, op.chunk);
  const int dst_vs = kind == MessageKind::kActivation ? vs + 1 : vs - 1;
  const int dst = rank_of(setup_.coord.d, setup_.shape.stage_of(dst_vs));
  chunk_[static_cast<std::size_t>(op.chunk)].holds[static_cast<std::size_t>(slot)]++;
  sends_pending_++;
  if (setup_.links != nullptr) {
    const StageCompute& sc = *setup_.chunks[static_cast<std::size_t>(op.chunk)];
    setup_.links->send(
        kind, dst, *setup_.stream,
        kind == MessageKind::kActivation ? sc.output(slot) : sc.input_grad(slot),
        // (Weak: a V's turn keeps it until its receive, which a failed
        // step never makes, and the links outlive the actor system.)
        [self = caf::actor_cast<caf::actor_addr>(this), c = op.chunk, slot](absl::Status st) {
          if (auto a = caf::actor_cast<caf::actor>(self)) {
            caf::anon_send(a, sent_atom::value, c, slot, status_text(st));
          }
        });
    return;
  }
  const Mirrors& mr = mirrors_[static_cast<std::size_t>(op.chunk)];
  const gpu::HostMirror& m = kind == MessageKind::kActivation
                                 ? mr.output[static_cast<std::size_t>(slot)]
                                 : mr.input_grad[static_cast<std::size_t>(slot)];
  m.to_host(*setup_.stream);
  // (The host buffer is held until the transport is done with it.)
  comm::Callback done = [self = caf::actor_cast<caf::actor>(this), c = op.chunk, slot,
                         keep = m.host()](absl::Status st) {
    caf::anon_send(self, sent_atom::value, c, slot, status_text(st));
  };
  setup_.stream->host_callback(
      [stream = setup_.stream, transport = setup_.transport, dst,
       tag = tag(kind, setup_.rank, op.micro, setup_.shape.chunk_of(dst_vs), 0),
       data = m.host_data<float>(), bytes = m.host().nbytes(), done = std::move(done)]() mutable {
        if (absl::Status st = stream->status(); !st.ok()) {
          return done(absl::AbortedError("not sent: the stream failed"));
        }
        // A small send completes at once (the receive is waiting, or UCX
        // sends it eagerly): this thread drives the transport through it,
        // so it completes here, in poll(), instead of waking the
        // transport's thread for it. From 64 KiB a send between processes
        // completes only once the receiver has read it (UCX's single-copy
        // protocol), so a poll right after finds nothing, and the progress
        // thread, stood down for it, would have to be woken again.
        // (Only on a stream whose host callbacks have a thread of their own:
        // a CUDA host function must not run a transport's completions.)
        constexpr std::size_t kDriveMaxBytes = 64 << 10;
        const bool drive = bytes < kDriveMaxBytes && stream->has_gates();
        comm::DriveScope scope(drive ? transport : nullptr);
        transport->send(dst, tag, data, bytes, std::move(done));
        if (drive) transport->poll();
      });
}

}  // namespace troupe::actors
