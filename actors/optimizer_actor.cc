// OptimizerActor: reduce, clip, step and all-gather one rank's partitions.
#include "actors/optimizer_actor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "actors/messages.h"
#include "actors/rank/stream_bridge.h"
#include "gpu/ops.h"

namespace troupe::actors {

using comm::MessageKind;

OptimizerActor::OptimizerActor(caf::actor_config& cfg, OptimizerSetup setup)
    : caf::event_based_actor(cfg), setup_(std::move(setup)) {
  sums_.resize(setup_.partitions.size());
  for (const GradPiece& p : setup_.grad_pieces) {
    if (p.dst_stage != setup_.coord.s || p.dst_d != setup_.coord.d) continue;
    Sum& sum = sums_[static_cast<std::size_t>(p.dst_chunk)];
    (p.tied_wte ? sum.tied : sum.main).push_back(&p);
  }
  for (Sum& sum : sums_) {
    const int dp = setup_.shape.dp;
    sum.contributions = sum.main.empty() ? 0 : dp + (sum.tied.empty() ? 0 : dp);
  }
}

caf::behavior OptimizerActor::make_behavior() {
  return {
      [this](begin_step_atom, int step, std::int64_t, float) { begin_step(step); },
      [this](recv_atom, int part, int k, const std::string& error) { on_recv(part, k, error); },
      [this](shard_atom, caf::actor shard) { shard_ = shard.address(); },
      [this](dp_reduced_atom, int step) {
        progress_++;
        if (step == step_) {
          on_reduced_on_device();
        } else if (step > step_) {
          reduced_early_ = step;  // (its shard sends begin_step first: kept for safety)
        }
      },
      [this](added_atom, int step, int part, int k) {
        progress_++;
        if (step == step_) on_added(part, k);
      },
      [this](reduced_atom, int step) {
        progress_++;
        if (step == step_) on_reduced();
      },
      [this](update_atom, int step, float lr, float grad_scale, int count) {
        if (step == step_) update(lr, grad_scale, count);
      },
      [this](update_atom, int step, float lr, float grad_scale, int count,
             std::int64_t next_first_sample, float next_loss_scale) {
        if (step != step_) return;
        // The next step begins with this update: the shard holds it until
        // it has this step's new parameters.
        caf::actor shard = caf::actor_cast<caf::actor>(shard_);
        if (!shard) return fail("the next step came with the update, and there is no shard");
        send(shard, begin_step_atom::value, step + 1, next_first_sample, next_loss_scale);
        update(lr, grad_scale, count);
      },
      [this](stepped_atom, int step) {
        progress_++;
        if (step == step_) on_stepped();
      },
      [this](sent_atom, int, int, const std::string& error) { on_sent(error); },
      [this](save_atom, int step, const std::string& tmp_dir) {
        // At a step boundary: the rank's state is copied now and written
        // behind; the coordinator hears of both.
        absl::Status st = setup_.save ? setup_.save(step, tmp_dir)
                                      : absl::FailedPreconditionError("this rank cannot save");
        progress_++;
        send(setup_.coordinator, snapshot_atom::value, step, setup_.rank, status_text(st));
      },
      [this](waiting_atom) {
        WaitReport r;
        r.rank = setup_.rank;
        r.actor = absl::StrCat("optimizer d=", setup_.coord.d, " s=", setup_.coord.s);
        r.step = step_;
        r.waiting = phase_ == "idle" ? "" : phase_;
        r.since_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
        r.progress = progress_;
        return r;
      },
  };
}

void OptimizerActor::begin_step(int step) {
  step_ = step;
  sums_done_ = 0;
  reduced_in_ = false;
  int pieces = 0;
  // With dp, contributions k < dp come by the shards' reduces: the sum
  // starts past them, and only the tied wte's shares are received.
  const int dp = setup_.shape.dp;
  for (std::size_t i = 0; i < sums_.size(); i++) {
    Sum& sum = sums_[i];
    const Partition& part = *setup_.partitions[i];
    sum.arrived.assign(static_cast<std::size_t>(sum.contributions), 0);
    const int first = pieces_on_device() ? std::min(dp, sum.contributions) : 0;
    sum.posted = sum.enqueued = sum.added = first;
    part.begin_sum(*setup_.stream);
    for (int k = first; k < std::min(first + part.window(), sum.contributions); k++)
      post(static_cast<int>(i), k);
    pieces += static_cast<int>((pieces_on_device() ? 0 : sum.main.size()) + sum.tied.size()) * dp;
    if (sum.contributions == 0) sums_done_++;
  }
  phase_ = pieces_on_device()
               ? absl::StrCat("the gradients of step ", step, " (the shard's reduces and ", pieces,
                              " pieces)")
               : absl::StrCat("the gradients of step ", step, " (", pieces, " pieces)");
  trace_wait(comm::trace::What::kGradients);
  since_ = std::chrono::steady_clock::now();
  if (sums_done_ == static_cast<int>(sums_.size())) on_recv(-1, 0, "");
  if (reduced_early_ == step) on_reduced_on_device();
}

// The receives of contribution k of partition `part`, into its slot.
void OptimizerActor::post(int part, int k) {
  Sum& sum = sums_[static_cast<std::size_t>(part)];
  const Partition& p = *setup_.partitions[static_cast<std::size_t>(part)];
  const int dp = setup_.shape.dp;
  const int r = k % dp;  // the replica
  auto self = caf::actor_cast<caf::actor>(this);
  sum.posted++;
  for (const GradPiece* g : k < dp ? sum.main : sum.tied) {
    const int src = rank_of(r, g->src_stage);
    setup_.transport->recv(src, tag(MessageKind::kGradSlice, src, g->src_chunk, g->bucket),
                           p.slot(k) + (g->range.begin - p.range().begin),
                           static_cast<std::size_t>(g->range.size()) * sizeof(float),
                           [self, part, k](absl::Status st) {
                             caf::anon_send(self, recv_atom::value, part, k, status_text(st));
                           });
  }
}

// A piece arrived: add every complete contribution that is next in order.
void OptimizerActor::on_recv(int part, int k, const std::string& error) {
  if (failed_) return;
  if (!error.empty()) return fail(absl::StrCat("receiving gradients: ", error));
  if (part < 0) return on_added(-1, 0);  // nothing to receive at all
  progress_++;
  sums_[static_cast<std::size_t>(part)].arrived[static_cast<std::size_t>(k)]++;
  enqueue_adds(part);
}

// With dp, not before the stream has waited for the reduces (the sum's
// first contributions).
void OptimizerActor::enqueue_adds(int part) {
  if (pieces_on_device() && !reduced_in_) return;
  Sum& sum = sums_[static_cast<std::size_t>(part)];
  const int dp = setup_.shape.dp;
  const Partition& p = *setup_.partitions[static_cast<std::size_t>(part)];
  while (sum.enqueued < sum.posted) {
    const int next = sum.enqueued;
    const std::size_t want = (next < dp ? sum.main : sum.tied).size();
    if (static_cast<std::size_t>(sum.arrived[static_cast<std::size_t>(next)]) < want) break;
    mark_stream(setup_.trace, *setup_.stream, stream_event(comm::trace::What::kAdd, part, next),
                [&] { p.add(*setup_.stream, next); });
    // Its slot is free once the stream has added it.
    send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                   caf::make_message(added_atom::value, step_, part, next));
    sum.enqueued++;
  }
}

// The shard's reduces are on its stream (with dp 1 there are none: this
// stream sums the chunk's own gradients): this stream waits for them, then
// adds what has come of the tied shares; a sum without them is complete.
void OptimizerActor::on_reduced_on_device() {
  if (failed_ || !pieces_on_device() || reduced_in_) return;
  reduced_early_ = -1;
  setup_.stream->wait(*setup_.dp_reduced);
  reduced_in_ = true;
  if (setup_.dp_alone) {  // the one replica's pieces, from the chunk's gradients
    for (std::size_t i = 0; i < sums_.size(); i++) {
      const Partition& part = *setup_.partitions[i];
      for (const GradPiece* g : sums_[i].main) {
        const gpu::Tensor sum =
            part.sum().view(g->range.begin - part.range().begin, {g->range.size()});
        gpu::ops::fill(*setup_.stream, sum, 0.0f);
        gpu::ops::axpy(*setup_.stream, sum, 1.0f,
                       part.chunk().grads().view(g->range.begin, {g->range.size()}));
      }
    }
  }
  for (std::size_t i = 0; i < sums_.size(); i++) {
    const Sum& sum = sums_[i];
    if (sum.contributions == 0) continue;  // (counted at begin_step)
    if (sum.added == sum.contributions) {
      finish_sum(static_cast<int>(i));
    } else {
      enqueue_adds(static_cast<int>(i));
    }
  }
  maybe_reduced();
}

void OptimizerActor::on_added(int part, int k) {
  if (failed_) return;
  if (part >= 0) {
    Sum& sum = sums_[static_cast<std::size_t>(part)];
    const Partition& p = *setup_.partitions[static_cast<std::size_t>(part)];
    sum.added++;
    if (k + p.window() < sum.contributions) post(part, k + p.window());
    if (sum.added < sum.contributions) return;
    finish_sum(part);
  }
  maybe_reduced();
}

void OptimizerActor::finish_sum(int part) {
  const Partition& p = *setup_.partitions[static_cast<std::size_t>(part)];
  mark_stream(setup_.trace, *setup_.stream, stream_event(comm::trace::What::kNorm, part),
              [&] { p.end_sum(*setup_.stream); });
  sums_done_++;
}

// Every sum is complete (with dp: and the reduces were waited for).
void OptimizerActor::maybe_reduced() {
  if (sums_done_ < static_cast<int>(sums_.size())) return;
  if (pieces_on_device() && !reduced_in_) return;
  send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                 caf::make_message(reduced_atom::value, step_));
}

void OptimizerActor::on_reduced() {
  if (failed_) return;
  if (absl::Status st = setup_.stream->status(); !st.ok()) {
    return fail(absl::StrCat("reducing gradients: ", st.message()));
  }
  double sq = 0.0;  // chunks in order; the coordinator sums ranks in order
  for (const Partition* p : setup_.partitions) sq += p->squared_norm();
  send(setup_.coordinator, norm_atom::value, step_, setup_.rank, sq);
  phase_ = "the clip factor from the coordinator";
  since_ = std::chrono::steady_clock::now();
  trace_wait(comm::trace::What::kClip);
}

void OptimizerActor::update(float lr, float grad_scale, int count) {
  if (failed_) return;
  trace_wait(comm::trace::What::kNone);
  phase_ = pieces_on_device() ? absl::StrCat("AdamW and the DP broadcasts of step ", step_)
                              : absl::StrCat("AdamW of step ", step_);
  since_ = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < setup_.partitions.size(); i++) {
    const Partition* p = setup_.partitions[i];
    mark_stream(setup_.trace, *setup_.stream,
                stream_event(comm::trace::What::kAdam, static_cast<int>(i)),
                [&] { p->step(*setup_.stream, setup_.adam, lr, count, grad_scale); });
  }
  if (pieces_on_device()) {
    broadcast_params();
    // The step's gradients are read (the sums, and the reduces before
    // them): the next step's start zeroed them on the shard's stream,
    // waking it; here, on a stream awake anyway and before the event the
    // next step's ops wait for, they cost no wake-up. (The shard leaves
    // them to this: every chunk's, which the partitions are one each of.)
    if (setup_.chunks.size() != setup_.partitions.size()) {
      return fail("the rank's chunks, whose gradients the update zeroes, were not given");
    }
    for (StageCompute* c : setup_.chunks) c->zero_grad(*setup_.stream);
    setup_.stream->record(*setup_.dp_params);  // (the shard hears of it once the stream is past it)
  }
  send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                 caf::make_message(stepped_atom::value, step_));
}

// Every piece of this stage from its owner (partition src_d: member src_d
// of the DP group) into every replica's shard, in the pieces' order (the
// same on every replica), behind AdamW (update() then records the params
// event, and the shard hears of it).
void OptimizerActor::broadcast_params() {
  gpu::Stream& s = *setup_.stream;
  for (const ParamPiece& p : setup_.param_pieces) {
    if (p.stage != setup_.coord.s || p.tied_wte) continue;
    const Partition& part = *setup_.partitions[static_cast<std::size_t>(p.src_chunk)];
    // (In the compute dtype: bf16 pieces with --bf16, as Megatron's
    // distributed optimizer gathers them.)
    const gpu::Tensor params = part.chunk().params().view(p.range.begin, {p.range.size()});
    if (setup_.dp_alone) {  // the owner is this rank
      gpu::ops::copy(
          s, params,
          part.compute_on_device().view(p.range.begin - part.range().begin, {p.range.size()}));
      continue;
    }
    std::vector<gpu::Tensor> held{params};
    const void* in = nullptr;
    if (p.src_d == setup_.coord.d) {
      const gpu::Tensor& compute = part.compute_on_device();
      in = compute.view(p.range.begin - part.range().begin, {p.range.size()}).raw();
      held.push_back(compute);
    }
    s.device_call("DP broadcast of the new parameters", std::move(held),
                  [dp = setup_.dp, in, out = params.raw(), bytes = params.nbytes(), root = p.src_d](
                      void* native) { return dp->broadcast_on(native, in, out, bytes, root); });
  }
}

void OptimizerActor::on_stepped() {
  if (failed_) return;
  if (absl::Status st = setup_.stream->status(); !st.ok()) {
    return fail(absl::StrCat(pieces_on_device() ? "AdamW and the DP broadcasts: " : "AdamW: ",
                             st.message()));
  }
  // All-gather as messages: every replica's shard gets the new range.
  auto self = caf::actor_cast<caf::actor>(this);
  for (const ParamPiece& p : setup_.param_pieces) {
    if (p.stage != setup_.coord.s || p.src_d != setup_.coord.d) continue;
    if (pieces_on_device() && !p.tied_wte) continue;  // broadcast on the device
    const Partition& part = *setup_.partitions[static_cast<std::size_t>(p.src_chunk)];
    // (In the compute dtype: bf16 pieces with --bf16.)
    const char* data = part.compute() + part.compute_bytes(p.range.begin - part.range().begin);
    for (int r = 0; r < setup_.shape.dp; r++) {
      sends_pending_++;
      setup_.transport->send(
          rank_of(r, p.dst_stage),
          tag(MessageKind::kParamSlice, setup_.rank, p.src_chunk, p.tied_wte ? 1 : 0), data,
          part.compute_bytes(p.range.size()), [self](absl::Status st) {
            caf::anon_send(self, sent_atom::value, 0, 0, status_text(st));
          });
    }
  }
  sends_step_ = step_;
  phase_ = sends_pending_ > 0 ? "the shards to take the new parameters" : "idle";
  since_ = std::chrono::steady_clock::now();
  // With dp the broadcasts are done: the shard may go ready (a shard ready
  // before would let the run end, or the next step begin, under them).
  if (pieces_on_device()) {
    send(caf::actor_cast<caf::actor>(shard_), dp_params_atom::value, step_);
  }
}

void OptimizerActor::on_sent(const std::string& error) {
  if (failed_) return;
  if (!error.empty()) return fail(absl::StrCat("sending parameters: ", error));
  // (The next step may have begun meanwhile: its phase stays.)
  if (--sends_pending_ == 0 && sends_step_ == step_) phase_ = "idle";
}

void OptimizerActor::fail(const std::string& what) {
  if (failed_) return;
  failed_ = true;
  send(setup_.coordinator, failed_atom::value, setup_.rank,
       absl::StrCat("optimizer of stage ", setup_.coord.s, " (replica ", setup_.coord.d,
                    "): ", what));
}

comm::trace::Event OptimizerActor::stream_event(comm::trace::What what, int chunk,
                                                int contribution) const {
  comm::trace::Event e;
  e.kind = comm::trace::Kind::kOptimizer;
  e.what = what;
  e.step = step_;
  e.chunk = chunk;
  e.micro = contribution;
  return e;
}

void OptimizerActor::trace_wait(comm::trace::What what) {
  if (setup_.trace == nullptr || setup_.trace->recorder == nullptr) return;
  comm::trace::Recorder& rec = *setup_.trace->recorder;
  rec.close(trace_wait_);
  trace_wait_ = comm::trace::Recorder::kNone;
  if (what == comm::trace::What::kNone) return;
  comm::trace::Event e;
  e.kind = comm::trace::Kind::kWait;
  e.what = what;
  e.actor = 1;
  e.step = step_;
  trace_wait_ = rec.open(e);
}

comm::Tag OptimizerActor::tag(MessageKind kind, int source, int chunk, int layer) const {
  return comm::make_tag({.source = static_cast<std::uint32_t>(source),
                         .group = comm::GroupKind::kData,
                         .kind = kind,
                         .step = static_cast<std::uint32_t>(step_),
                         .micro = 0,
                         .chunk = static_cast<std::uint32_t>(chunk),
                         .layer = static_cast<std::uint32_t>(layer)});
}

}  // namespace troupe::actors
