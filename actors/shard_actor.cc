// ShardActor: a stage's schedule, driven by the arrival of its inputs.
#include "actors/shard_actor.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "actors/messages.h"
#include "actors/optimizer_actor.h"
#include "actors/rank/stream_bridge.h"
#include "model/loss_scale.h"

namespace troupe::actors {

using comm::MessageKind;
namespace trace = comm::trace;

ShardActor::ShardActor(caf::actor_config& cfg, ShardSetup setup)
    : caf::event_based_actor(cfg), setup_(std::move(setup)) {
  const std::vector<ScheduleOp>* full = train_ops(setup_.m);
  // (Without one, setup_error_ says why: a constructor cannot fail, so the
  // first message the actor handles does.)
  if (full != nullptr) {
    for (const ScheduleOp& op : *full) {
      if (op.kind != OpKind::kForward) continue;
      eval_ops_.push_back(op);
      eval_ops_.back().id = static_cast<int>(eval_ops_.size()) - 1;
    }
  }
  bool needs_data = false;
  for (StageCompute* sc : setup_.chunks) {
    Mirrors mr;
    for (int k = 0; k < sc->slots(); k++) {
      // (With links, activations and gradients stay on the device.)
      if (!sc->spec().embedding && setup_.links == nullptr) {
        mr.input.emplace_back(sc->input(k));
        mr.input_grad.emplace_back(sc->input_grad(k));
      }
      if (!sc->spec().head && setup_.links == nullptr) {
        mr.output.emplace_back(sc->output(k));
        mr.output_grad.emplace_back(sc->output_grad(k));
      } else if (sc->spec().head) {
        mr.losses.emplace_back(sc->losses(k));
      }
    }
    mr.params = gpu::HostMirror(sc->params());
    mr.grads = gpu::HostMirror(sc->grads());
    mirrors_.push_back(std::move(mr));
    ChunkState cs;
    for (int k = sc->slots() - 1; k >= 0; k--) cs.free.push_back(k);
    for (int k = sc->stashes() - 1; k >= 0; k--) cs.free_stashes.push_back(k);
    cs.holds.assign(static_cast<std::size_t>(sc->slots()), 0);
    cs.buckets = grad_buckets(sc->layout(), sc->spec());
    chunk_.push_back(std::move(cs));
    needs_data = needs_data || sc->spec().embedding || sc->spec().head;
  }
  if (needs_data) {
    gpu::Device& dev = setup_.stream->device();
    for (int j = 0; j < setup_.m; j++) {
      tokens_.emplace_back(gpu::Tensor::empty(dev, gpu::DType::kI32, {setup_.B, setup_.T}));
      targets_.emplace_back(gpu::Tensor::empty(dev, gpu::DType::kI32, {setup_.B, setup_.T}));
    }
  }
  set_exception_handler([this](caf::scheduled_actor*, std::exception_ptr& e) -> caf::error {
    const std::string what = exception_text(e);
    fail(absl::StrCat("threw: ", what));
    return caf::make_error(caf::sec::runtime_error, what);
  });
}

const std::vector<ScheduleOp>* ShardActor::train_ops(int m) {
  if (auto it = train_ops_.find(m); it != train_ops_.end()) return &it->second;
  absl::StatusOr<std::vector<ScheduleOp>> ops = make_schedule(
      setup_.schedule, setup_.shape.pp, setup_.coord.s, m, setup_.shape.virtual_stages);
  if (!ops.ok()) {
    setup_error_ = absl::StrCat("no schedule: ", ops.status().message());
    return nullptr;
  }
  return &train_ops_.emplace(m, *std::move(ops)).first->second;
}

caf::behavior ShardActor::make_behavior() {
  if (!setup_error_.empty()) fail(setup_error_);  // every step handler then does nothing
  return {
      [this](begin_step_atom, int step, std::int64_t first_sample, float loss_scale) {
        if (step_ == 0) return begin_train(step, first_sample, loss_scale);
        // The step after this one, begun with this one's update: held
        // until this shard has its new parameters (maybe_ready).
        if (early_.step != 0 || step != step_ + 1) {
          return fail(absl::StrCat("begin_step ", step, " came during step ", step_,
                                   early_.step != 0 ? " with the next one already held" : ""));
        }
        early_ = {.step = step, .first_sample = first_sample, .loss_scale = loss_scale};
      },
      [this](eval_atom, int step, std::int64_t first_sample) {
        begin(Pass::kEval, step, first_sample);
      },
      [this](op_done_atom, int op_id) { on_op_done(op_id); },
      [this](params_in_atom, int step) { on_params_in(step); },
      [this](dp_params_atom, int step) {
        if (failed_ || step != step_ || !pieces_on_device()) return;
        setup_.stream->wait(*setup_.dp_params);  // the next step's ops come after them
        grads_zeroed_ = true;                    // (the optimizer zeroed them before the event)
        progress_++;
        params_arrived_++;
        maybe_ready();
      },
      [this](bucket_atom, int step, int chunk, int bucket) {
        if (step == step_) on_bucket(chunk, bucket);
      },
      [this](recv_atom, int what, int id, const std::string& error) {
        on_recv(static_cast<Msg>(what), id, error);
      },
      [this](sent_atom, int chunk, int slot, const std::string& error) {
        on_sent(chunk, slot, error);
      },
      [this](waiting_atom) { return report(); },
      [this](recheck_atom, int step, int op) {
        if (step != step_ || op != recheck_op_) return;
        overdue_op_ = op;
        advance();
      },
  };
}

void ShardActor::begin_train(int step, std::int64_t first_sample, float loss_scale) {
  // The rank's optimizer begins the step from here, not from the
  // coordinator: one message to a rank a step, which between processes is
  // one control frame, not two.
  if (caf::actor optimizer = caf::actor_cast<caf::actor>(setup_.optimizer)) {
    send(optimizer, begin_step_atom::value, step, first_sample, loss_scale);
  }
  loss_scale_ = loss_scale;
  begin(Pass::kTrain, step, first_sample);
}

void ShardActor::begin(Pass pass, int step, std::int64_t first_sample) {
  if (failed_) return;
  if (pass == Pass::kTrain && setup_.fail.stage == setup_.coord.s && setup_.fail.step == step) {
    if (setup_.fail.kind == FailPoint::Kind::kStall) return;  // never starts the step
    throw std::runtime_error(absl::StrCat("injected failure at step ", step));
  }
  pass_ = pass;
  // A ramp-up's step has fewer micro-batches; evaluation reads full batches.
  const bool ramped = pass == Pass::kTrain && setup_.batches.steps() > 0;
  global_batch_ = ramped ? setup_.batches.global_batch(step) : setup_.global_batch;
  m_ = global_batch_ / (setup_.B * setup_.shape.dp);
  ops_ = pass == Pass::kTrain ? train_ops(m_) : &eval_ops_;
  if (ops_ == nullptr) {
    ops_ = &eval_ops_;
    return fail(setup_error_);
  }
  if (setup_.trace != nullptr && setup_.trace->step != nullptr) setup_.trace->step->store(step);
  if (setup_.trace != nullptr && setup_.trace->recorder != nullptr) {
    trace::Event e;
    e.kind = trace::Kind::kStep;
    e.what = pass == Pass::kTrain ? trace::What::kTrain : trace::What::kEval;
    e.step = step;
    e.micro = m_;  // (a ramp-up's step has fewer than the header's m)
    trace_step_ = setup_.trace->recorder->open(e);
  }
  const model::data::SampleSource* source = pass == Pass::kTrain ? setup_.data : setup_.valid;
  if (source == nullptr) return fail("evaluation asked for, but there is no validation data");
  step_ = step;
  first_sample_ = first_sample;
  cursor_ = 0;
  ops_done_ = 0;
  input_.assign(ops_->size(), Arrival::kNone);
  ahead_waits_.clear();
  params_posted_ = false;
  params_expected_ = params_arrived_ = 0;
  params_state_ = Params::kArriving;
  for (ChunkState& cs : chunk_) {
    cs.backwards_fired = 0;
    cs.weights_fired = 0;
    cs.slot_of.assign(static_cast<std::size_t>(m_), -1);
    cs.stash_of.assign(static_cast<std::size_t>(m_), -1);
  }
  fired_.clear();
  pending_w_.clear();
  stash_wait_ = false;
  if (pass == Pass::kTrain && input_gap_ms_.size() != ops_->size()) {
    input_gap_ms_.assign(ops_->size(), -1.0);  // (a ramp-up's new m: its own list)
  }
  dry_op_ = timed_piece_ = recheck_op_ = overdue_op_ = -1;
  weight_op_.assign(chunk_.size() * static_cast<std::size_t>(m_), -1);
  for (const ScheduleOp& op : *ops_) {
    if (op.kind == OpKind::kWeight)
      weight_op_[static_cast<std::size_t>(op.chunk * m_ + op.micro)] = op.id;
  }
  // The micro-batches of this replica, as the single-rank loop reads them:
  // replica d's micro-batch j is global micro-batch j*dp + d. (The last
  // step's ops are done, so their buffers are free.) All are read before a
  // copy is queued: a bad sample leaves nothing behind on the stream.
  const int loaded = std::min(m_, static_cast<int>(tokens_.size()));
  for (int j = 0; j < loaded; j++) {
    const std::int64_t first = model::data::micro_batch_first_sample(first_sample, setup_.coord.d,
                                                                     setup_.shape.dp, j, setup_.B);
    const auto k = static_cast<std::size_t>(j);
    absl::Status st = model::data::load_batch(*source, first, setup_.B, setup_.T,
                                              tokens_[k].host_data<std::int32_t>(),
                                              targets_[k].host_data<std::int32_t>());
    if (!st.ok()) return fail(std::string(st.message()));
  }
  for (int j = 0; j < loaded; j++) {
    tokens_[static_cast<std::size_t>(j)].to_device(*setup_.stream);
    targets_[static_cast<std::size_t>(j)].to_device(*setup_.stream);
  }
  if (pass == Pass::kTrain) {
    if (!grads_zeroed_) {
      for (StageCompute* sc : setup_.chunks) sc->zero_grad(*setup_.stream);
    }
    grads_zeroed_ = false;
  } else {
    params_posted_ = true;  // nothing to receive: the parameters do not change
  }
  advance();
}

// Fires ops in schedule order for as long as their inputs are there
// (zb-auto: its W's by its own rule).
void ShardActor::advance() {
  const bool automatic = setup_.schedule == ScheduleKind::kZbAuto && pass_ == Pass::kTrain;
  while (!failed_) {
    while (!failed_ && cursor_ < ops_->size()) {
      const ScheduleOp& op = (*ops_)[cursor_];
      if (!(automatic && op.kind == OpKind::kWeight) && !try_fire(op)) break;
      end_trace_wait();
      cursor_++;
    }
    if (failed_ || !automatic || !auto_weights()) break;
  }
  if (failed_ || cursor_ < ops_->size() || !pending_w_.empty()) return;
  if (!params_posted_) post_param_receives();
  maybe_ready();
}

bool ShardActor::try_fire(const ScheduleOp& op) {
  ChunkState& cs = chunk_[static_cast<std::size_t>(op.chunk)];
  StageCompute& sc = *setup_.chunks[static_cast<std::size_t>(op.chunk)];
  const int vs = setup_.shape.virtual_stage(setup_.coord.s, op.chunk);
  int& slot = cs.slot_of[static_cast<std::size_t>(op.micro)];
  const Mirrors& mr = mirrors_[static_cast<std::size_t>(op.chunk)];
  const bool links = setup_.links != nullptr;
  if (op.kind == OpKind::kForward) {
    if (slot < 0) {
      if (cs.free.empty()) {
        wait_for(&op, absl::StrCat("a free activation slot (all ", sc.slots(), " in use)"), -1,
                 trace::What::kSlot);
        return false;
      }
      slot = cs.free.back();
      cs.free.pop_back();
      cs.holds[static_cast<std::size_t>(slot)] = 1;  // until its backward is done
    }
    if (!sc.spec().embedding) {
      const int src = rank_of(setup_.coord.d, setup_.shape.stage_of(vs - 1));
      const gpu::Tensor into =
          links ? sc.input(slot) : mr.input[static_cast<std::size_t>(slot)].host();
      if (!post_receive(op, MessageKind::kActivation, src, into)) {
        wait_for(&op, absl::StrCat("the activation from rank ", src), src,
                 trace::What::kActivation);
        return false;
      }
    }
    fire_forward(op, slot);
  } else if (op.kind == OpKind::kWeight) {
    fire_weight(op, 0, -1);
  } else {
    if (splits_backward(setup_.schedule) && cs.stash_of[static_cast<std::size_t>(op.micro)] < 0) {
      if (cs.free_stashes.empty()) {
        stash_wait_ = true;
        wait_for(&op, absl::StrCat("a free weight stash (all ", sc.stashes(), " in use)"), -1,
                 trace::What::kSlot);
        return false;
      }
      cs.stash_of[static_cast<std::size_t>(op.micro)] = cs.free_stashes.back();
      cs.free_stashes.pop_back();
    }
    if (!sc.spec().head) {
      const int src = rank_of(setup_.coord.d, setup_.shape.stage_of(vs + 1));
      const gpu::Tensor into =
          links ? sc.output_grad(slot) : mr.output_grad[static_cast<std::size_t>(slot)].host();
      if (!post_receive(op, MessageKind::kGradient, src, into)) {
        wait_for(&op, absl::StrCat("the gradient from rank ", src), src, trace::What::kGradient);
        return false;
      }
    }
    fire_backward(op, slot);
  }
  return true;
}

bool ShardActor::post_receive(const ScheduleOp& op, MessageKind kind, int src,
                              const gpu::Tensor& into) {
  Arrival& in = input_[static_cast<std::size_t>(op.id)];
  if (in != Arrival::kNone) return in == Arrival::kArrived;
  if (setup_.links != nullptr) {
    // The compute stream waits for it in front of the op, which fires now;
    // until its receive's event says it is there, a stall report names the peer.
    std::shared_ptr<gpu::Event> done = setup_.links->recv(kind, src, *setup_.stream, into);
    ahead_waits_[op.id] = {.kind = kind,
                           .from = src,
                           .link = true,
                           .there = [done] { return done->query(); },
                           .since = std::chrono::steady_clock::now()};
    in = Arrival::kArrived;
    return true;
  }
  const Msg what = kind == MessageKind::kActivation ? Msg::kActivation : Msg::kGradient;
  const comm::Tag t = tag(kind, src, op.micro, op.chunk, 0);
  if (fires_ahead() && setup_.stream->has_gates()) {
    // The op fires now, behind the gate; the receive's completion opens it
    // (an error fails the stream, and comes here too). A stall report names
    // the peer until it is there; the trace shows the stream's wait at the
    // gate, from when the stream gets there (if it is not there yet; an
    // idle stream is there already and is not woken for the mark).
    auto landing = std::make_shared<Landing>();
    if (setup_.trace != nullptr && setup_.trace->recorder != nullptr &&
        setup_.trace->recorder->wants(step_)) {
      trace::Event e;
      e.kind = trace::Kind::kWait;
      e.actor = 2;  // the compute stream
      e.what = kind == MessageKind::kActivation ? trace::What::kActivation : trace::What::kGradient;
      e.step = step_;
      e.peer = src;
      e.micro = op.micro;
      e.chunk = op.chunk;
      setup_.stream->host_note(
          [landing, recorder = setup_.trace->recorder, e] { landing->wait(*recorder, e); });
    }
    gpu::GateOpener open = setup_.stream->gate();
    setup_.transport->recv(
        src, t, into.host<float>(), into.nbytes(),
        [open = std::move(open), landing, self = caf::actor_cast<caf::actor>(this), what, src,
         id = op.id, keep = into](absl::Status st) {
          landing->arrive();
          if (st.ok()) return open(std::move(st));
          caf::anon_send(self, recv_atom::value, static_cast<int>(what), id, status_text(st));
          // (The stream's error says what failed, for the ops it skips.)
          const char* name = what == Msg::kActivation ? "activation" : "gradient";
          open(absl::Status(st.code(), absl::StrCat("receiving the ", name, " from rank ", src,
                                                    ": ", st.message())));
        });
    ahead_waits_[op.id] = {.kind = kind,
                           .from = src,
                           .link = false,
                           .there = [landing] { return landing->there(); },
                           .since = std::chrono::steady_clock::now()};
    in = Arrival::kArrived;
    return true;
  }
  in = Arrival::kPosted;
  setup_.transport->recv(src, t, into.host<float>(), into.nbytes(), reply(what, op.id, into));
  return false;
}

bool ShardActor::fires_ahead() const {
  return pass_ == Pass::kEval || setup_.schedule != ScheduleKind::kZbAuto;
}

void ShardActor::on_op_done(int op_id) {
  if (failed_) return;
  const ScheduleOp& op = (*ops_)[static_cast<std::size_t>(op_id)];
  if (absl::Status st = setup_.stream->status(); !st.ok()) {
    // The stream's error is sticky: it happened at or before this op.
    return fail(absl::StrCat("at or before the ", describe(op), ": ", st.message()));
  }
  if (fired_.empty() || fired_.front().op_id != op_id) {
    return fail(absl::StrCat("the ", describe(op), " finished out of the stream's order"));
  }
  const bool last = fired_.front().last;
  fired_.pop_front();
  note_done(op_id);
  if (!last) {  // a W piece with more to come
    progress_++;
    advance();
    return;
  }
  ChunkState& cs = chunk_[static_cast<std::size_t>(op.chunk)];
  StageCompute& sc = *setup_.chunks[static_cast<std::size_t>(op.chunk)];
  const int slot = cs.slot_of[static_cast<std::size_t>(op.micro)];
  if (op.kind == OpKind::kForward) {
    if (sc.spec().head) {
      // The micro-batch's loss sum, in token order (as the single-rank
      // loop), from the copy the stream made behind the forward.
      const gpu::HostMirror& losses =
          mirrors_[static_cast<std::size_t>(op.chunk)].losses[static_cast<std::size_t>(slot)];
      const float* l = losses.host_data<float>();
      double sum = 0.0;
      for (std::int64_t i = 0; i < losses.host().numel(); i++) sum += l[i];
      // Every TP rank has the same losses; rank t = 0 reports them.
      if (setup_.coord.t == 0) {
        send(setup_.coordinator, loss_atom::value, step_, setup_.coord.d, op.micro, sum);
      }
    }
    if (pass_ == Pass::kEval) release(op.chunk, slot);  // no backward will need it
  } else if (op.kind == OpKind::kBackward) {
    release(op.chunk, slot);  // the forward's hold: activations are free once sent
  }
  ops_done_++;
  progress_++;
  advance();
}

void ShardActor::on_bucket(int chunk, int bucket) {
  if (failed_) return;
  if (absl::Status st = setup_.stream->status(); !st.ok()) {
    return fail(absl::StrCat("backward of chunk ", chunk, ": ", st.message()));
  }
  // (The stream copied the bucket to the host behind the backward; the
  // sends hold the host buffer until the transport is done with it.)
  const gpu::Tensor& host = mirrors_[static_cast<std::size_t>(chunk)].grads.host();
  const float* grads = host.host<float>();
  auto self = caf::actor_cast<caf::actor>(this);
  for (const GradPiece& p : setup_.grad_pieces) {
    if (p.src_stage != setup_.coord.s || p.src_chunk != chunk || p.bucket != bucket) continue;
    if (pieces_on_device() && !p.tied_wte) continue;  // reduced on the device
    const int dst = rank_of(p.dst_d, p.dst_stage);
    sends_pending_++;
    setup_.transport->send(dst, tag(MessageKind::kGradSlice, setup_.rank, 0, chunk, bucket),
                           grads + p.range.begin,
                           static_cast<std::size_t>(p.range.size()) * sizeof(float),
                           [self, keep = host](absl::Status st) {
                             caf::anon_send(self, sent_atom::value, -1, -1, status_text(st));
                           });
  }
}

// Each piece of the bucket to its partition's owner (member dst_d of the DP
// group), in the pieces' order, which every replica's stream reaches at the
// same point of the same schedule.
bool ShardActor::reduce_bucket(int chunk, int bucket) {
  bool tied = false;
  const gpu::Tensor& grads = setup_.chunks[static_cast<std::size_t>(chunk)]->grads();
  for (const GradPiece& p : setup_.grad_pieces) {
    if (p.src_stage != setup_.coord.s || p.src_chunk != chunk || p.bucket != bucket) continue;
    if (p.tied_wte) {
      tied = true;
      continue;
    }
    if (setup_.dp_alone) continue;  // the optimizer's stream sums it, off the backward's
    std::vector<gpu::Tensor> held{grads};
    float* out = nullptr;
    if (p.dst_d == setup_.coord.d) {
      const Partition& part = *setup_.partitions[static_cast<std::size_t>(p.dst_chunk)];
      out = part.sum().data<float>() + (p.range.begin - part.range().begin);
      held.push_back(part.sum());
    }
    const float* in = grads.data<float>() + p.range.begin;
    const auto n = static_cast<std::size_t>(p.range.size());
    setup_.stream->device_call("DP reduce of a gradient piece", std::move(held),
                               [dp = setup_.dp, in, out, n, root = p.dst_d](void* native) {
                                 return dp->reduce_on(native, in, out, n, root);
                               });
  }
  return tied;
}

void ShardActor::post_param_receives() {
  params_posted_ = true;
  if (pieces_on_device()) {
    // Every reduce is on the stream, and every op of the step: the
    // optimizer's stream waits for this event before it reads the sums, and
    // its broadcasts overwrite the parameters only after the last op that
    // reads them.
    setup_.stream->record(*setup_.dp_reduced);
    send(caf::actor_cast<caf::actor>(setup_.optimizer), dp_reduced_atom::value, step_);
    params_expected_++;  // the optimizer's word that the broadcasts are done
  }
  int id = 0;
  for (const ParamPiece& p : setup_.param_pieces) {
    if (p.dst_stage != setup_.coord.s) continue;
    if (pieces_on_device() && !p.tied_wte) continue;  // broadcast on the device
    const int src = rank_of(p.src_d, p.stage);
    const gpu::Tensor& params = mirrors_[static_cast<std::size_t>(p.dst_chunk)].params.host();
    const gpu::Tensor piece = params.view(p.range.begin, {p.range.size()});  // compute dtype
    params_expected_++;
    setup_.transport->recv(src,
                           tag(MessageKind::kParamSlice, src, 0, p.src_chunk, p.tied_wte ? 1 : 0),
                           piece.raw(), piece.nbytes(), reply(Msg::kParams, id++, params));
  }
  wait_for(nullptr, "the new parameters from the optimizer partitions", -1, trace::What::kParams);
}

void ShardActor::on_recv(Msg what, int id, const std::string& error) {
  if (failed_) return;
  if (!error.empty()) {
    const char* names[] = {"activation", "gradient", "parameters"};
    return fail(absl::StrCat("receiving ", names[static_cast<int>(what)], ": ", error));
  }
  progress_++;
  if (what == Msg::kParams) {
    params_arrived_++;
    return maybe_ready();
  }
  input_[static_cast<std::size_t>(id)] = Arrival::kArrived;
  note_input(id);
  if (cursor_ < ops_->size() && (*ops_)[cursor_].id == id) advance();
}

void ShardActor::on_sent(int chunk, int slot, const std::string& error) {
  if (failed_) return;
  if (!error.empty()) return fail(absl::StrCat("sending: ", error));
  sends_pending_--;
  if (slot >= 0) release(chunk, slot);
  advance();
}

void ShardActor::release(int chunk, int slot) {
  ChunkState& cs = chunk_[static_cast<std::size_t>(chunk)];
  if (--cs.holds[static_cast<std::size_t>(slot)] == 0) cs.free.push_back(slot);
}

void ShardActor::maybe_ready() {
  if (step_ == 0 || cursor_ < ops_->size() || ops_done_ < static_cast<int>(ops_->size()) ||
      sends_pending_ > 0 || !params_posted_ || params_arrived_ < params_expected_) {
    return;
  }
  if (params_state_ == Params::kCopying) return;
  if (params_state_ == Params::kArriving) {
    // The new parameters are in host memory; on a device, copied over
    // before the shard is ready (its next step's ops come after them).
    bool queued = false;
    for (const ParamPiece& p : setup_.param_pieces) {
      if (p.dst_stage != setup_.coord.s || pass_ != Pass::kTrain) continue;
      if (pieces_on_device() && !p.tied_wte) continue;  // on the device already
      const gpu::HostMirror& m = mirrors_[static_cast<std::size_t>(p.dst_chunk)].params;
      if (!m.separate()) continue;
      m.to_device(*setup_.stream, p.range.begin, p.range.size());
      queued = true;
    }
    params_state_ = Params::kIn;
    if (queued) {
      params_state_ = Params::kCopying;
      wait_for(nullptr, "the new parameters' copy to the device", -1, trace::What::kParams);
      send_when_done(*setup_.stream, caf::actor_cast<caf::actor>(this),
                     caf::make_message(params_in_atom::value, step_));
      return;
    }
  }
  send(setup_.coordinator, ready_atom::value, step_, setup_.rank);
  step_ = 0;
  wait_for(nullptr, "", -1);
  if (setup_.trace != nullptr && setup_.trace->recorder != nullptr) {
    setup_.trace->recorder->close(trace_step_);
    trace_step_ = trace::Recorder::kNone;
  }
  if (early_.step != 0) {
    const EarlyBegin next = std::exchange(early_, {});
    begin_train(next.step, next.first_sample, next.loss_scale);
  }
}

void ShardActor::on_params_in(int step) {
  if (failed_ || step != step_ || params_state_ != Params::kCopying) return;
  if (absl::Status st = setup_.stream->status(); !st.ok()) {
    return fail(absl::StrCat("copying the new parameters to the device: ", st.message()));
  }
  params_state_ = Params::kIn;
  maybe_ready();
}

void ShardActor::fail(const std::string& what) {
  if (failed_) return;
  failed_ = true;
  send(setup_.coordinator, failed_atom::value, setup_.rank,
       absl::StrCat("stage ", setup_.coord.s, " (replica ", setup_.coord.d,
                    setup_.layout.tp > 1 ? absl::StrCat(", tensor rank ", setup_.coord.t) : "",
                    "): ", what));
}

// (`keep`: the receive buffer, held until the transport is done with it.)
comm::Callback ShardActor::reply(Msg what, int id, gpu::Tensor keep) {
  return [self = caf::actor_cast<caf::actor>(this), what, id,
          keep = std::move(keep)](absl::Status st) {
    caf::anon_send(self, recv_atom::value, static_cast<int>(what), id, status_text(st));
  };
}

comm::Tag ShardActor::tag(MessageKind kind, int source, int micro, int chunk, int layer) const {
  const bool pipeline = kind == MessageKind::kActivation || kind == MessageKind::kGradient;
  return comm::make_tag({.source = static_cast<std::uint32_t>(source),
                         .group = pipeline ? comm::GroupKind::kPipeline : comm::GroupKind::kData,
                         .kind = kind,
                         .step = static_cast<std::uint32_t>(step_),
                         .micro = static_cast<std::uint32_t>(micro),
                         .chunk = static_cast<std::uint32_t>(chunk),
                         .layer = static_cast<std::uint32_t>(layer)});
}

}  // namespace troupe::actors
