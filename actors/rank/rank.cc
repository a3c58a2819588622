// One rank's buffers, streams and actors.
#include "actors/rank/rank.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "actors/messages.h"
#include "actors/rank/tensor_link.h"
#include "comm/traced_transport.h"
#include "gpu/host_values.h"
#include "model/weights.h"

namespace troupe::actors {

model::GptConfig ParallelOptions::sliced_config(const model::GptConfig& c) const {
  model::GptConfig out = c;
  out.vocab_multiple = c.vocab_multiple * std::max(tp, 1);
  return out;
}

absl::Status ParallelOptions::validate(const model::TrainOptions& o) const {
  if (absl::Status st = o.validate(); !st.ok()) return st;
  if (tp < 1 || pp < 1 || dp < 1 || virtual_stages < 1) {
    return absl::InvalidArgumentError("--tp, --pp, --dp and --virtual-stages must be positive");
  }
  if (absl::Status st = check_placement(schedule, layout()); !st.ok()) return st;
  if (v_shape && o.model.L % (2 * pp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule ", schedule_name(schedule), ": --layers ", o.model.L,
                     " does not split into 2 equal chunks on each of --pp ", pp,
                     " stages (a multiple of ", 2 * pp, " is needed)"));
  }
  if (absl::Status st = check_layer_split(o.model.L, pp, virtual_stages); !st.ok()) return st;
  if (zb_max_pending_w != 0 && (schedule != ScheduleKind::kZbAuto || zb_max_pending_w < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--zb-max-pending-w ", zb_max_pending_w,
                     ": a number of micro-batches (>= 1) for --schedule zb-auto"));
  }
  if (o.global_batch % (o.micro_batch * dp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global-batch-size ", o.global_batch, " must be a multiple of --micro-batch-size ",
        o.micro_batch, " x --dp ", dp, " = ", o.micro_batch * dp));
  }
  if (absl::Status st = check_pipeline_shape(o.model, layout(), m(o)); !st.ok()) return st;
  if (tp > 1) {
    // Each TP rank's vocabulary slice must hold a real row (the last ones
    // hold the padding).
    const model::GptConfig c = sliced_config(o.model);
    const std::int64_t last_begin = static_cast<std::int64_t>(c.Vp()) / tp * (tp - 1);
    if (last_begin >= c.V) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--make-vocab-size-divisible-by ", o.model.vocab_multiple, " x --tp ", tp,
          " pads the vocabulary of ", c.V, " to ", c.Vp(), ": TP rank ", tp - 1,
          " would hold only padding rows; make --make-vocab-size-divisible-by smaller"));
    }
  }
  for (int s = 0; s < pp; s++) {
    auto ops = make_schedule(schedule, pp, s, m(o), virtual_stages);
    if (!ops.ok()) return ops.status();
  }
  if (o.activations.sequence_parallel) {
    if (tp < 2) {
      return absl::InvalidArgumentError("--sequence-parallel needs --tp of at least 2");
    }
    if (static_cast<std::int64_t>(o.micro_batch) * o.model.T % tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sequence-parallel: the micro-batch's ", o.micro_batch, " x ", o.model.T,
                       " tokens do not split into --tp ", tp, " equal parts"));
    }
  }
  if (o.rampup.enabled()) {
    if (absl::Status st = model::check_rampup(o.rampup, o.global_batch, o.micro_batch * dp);
        !st.ok()) {
      return st;
    }
    // Every batch of the ramp must make a schedule (interleaved: a multiple of pp).
    for (int b = o.rampup.start; b < o.global_batch; b += o.rampup.increment) {
      if (!make_schedule(schedule, pp, 0, b / (o.micro_batch * dp), virtual_stages).ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--rampup-batch-size: the ramp's global batch ", b, " is ", b / (o.micro_batch * dp),
            " micro-batches a replica, which the ", schedule_name(schedule),
            " schedule cannot run with --pp ", pp,
            schedule == ScheduleKind::kInterleaved1F1B ? " (a multiple of pp is needed)" : ""));
      }
    }
  }
  return absl::OkStatus();
}

int stashes_for(const ParallelOptions& par, const std::vector<ScheduleOp>& ops, int chunk) {
  if (par.schedule == ScheduleKind::kZbAuto && par.zb_max_pending_w > 0) {
    return par.zb_max_pending_w;
  }
  return peak_pending_weights(ops, chunk);
}

absl::StatusOr<std::unique_ptr<RankUnit>> RankUnit::create(
    const RankSpec& spec, std::unique_ptr<comm::Transport> transport) {
  gpu::Device& dev = spec.parallel.device != nullptr ? *spec.parallel.device : gpu::cpu_device();
  const std::int64_t at_start = dev.allocated_bytes();
  std::unique_ptr<RankUnit> u(new RankUnit(spec));
  const ParallelOptions& par = spec.parallel;
  const model::TrainOptions& o = spec.options;
  const model::GptConfig& c = o.model;
  const comm::Layout layout = par.layout();
  u->coord_ = layout.coord(spec.rank);
  u->shape_ = par.layout();
  {
    const std::vector<Chunk> pipeline = pipeline_chunks(c, u->shape_);
    u->grad_pieces_ = grad_pieces(pipeline, u->shape_);
    u->param_pieces_ = param_pieces(pipeline, u->shape_);
  }
  u->recorder_ = std::make_unique<comm::trace::Recorder>(spec.trace.capacity());
  u->recorder_->set_steps(spec.trace.first_step, spec.trace.last_step);
  u->trace_ = std::make_unique<RankTrace>();
  u->trace_->step = u->trace_step_.get();
  if (spec.trace.off) {
    u->transport_ = std::move(transport);
  } else {
    u->trace_->recorder = u->recorder_.get();
    u->transport_ = std::make_unique<comm::TracedTransport>(
        std::move(transport), u->recorder_.get(), u->trace_step_.get());
  }
  u->stream_ = dev.make_stream({.threads = std::max(1, spec.threads), .tf32 = o.tf32});
  // With dp 1 the optimizer's work waits for the step's last op anyway (its
  // sums read the step's gradients) and the next step's first waits for
  // it: it goes on the compute stream, in its order, which saves a thread a
  // rank, the event between the two streams and the wake-ups it cost
  // (docs/ARCHITECTURE.md, the pipeline hop). With a DP group a stream of
  // its own: on the CPU the partitions add the replicas' pieces as they
  // come while the backward goes on. (With device collectives it waits for
  // the step's end as with dp 1, and could be the compute stream too: not
  // measured on a GPU.)
  if (par.dp == 1) {
    u->optimizer_stream_ = u->stream_.get();
  } else {
    u->own_optimizer_stream_ = dev.make_stream({.threads = 1});
    u->optimizer_stream_ = u->own_optimizer_stream_.get();
  }
  model::TensorParallel tensor;
  tensor.slice = {par.tp, u->coord_.t};
  if (par.tp > 1) {
    if (absl::Status st = u->make_tensor_parallel(dev, &tensor); !st.ok()) return st;
  }
  if (absl::Status st = u->make_links(dev); !st.ok()) return st;
  if (absl::Status st = u->make_data_parallel(dev); !st.ok()) return st;
  absl::StatusOr<std::vector<ScheduleOp>> ops =
      make_schedule(par.schedule, par.pp, u->coord_.s, par.m(o), par.virtual_stages);
  if (!ops.ok()) return ops.status();
  const std::vector<Chunk> mine = rank_chunks(c, u->shape_, u->coord_);
  for (int ch = 0; ch < par.virtual_stages; ch++) {
    const model::StageSpec& stage = mine[static_cast<std::size_t>(ch)].spec;
    // One more slot than the schedule's peak when there are neighbours, so
    // a micro-batch whose gradient is still leaving does not hold up the
    // next forward. A stash is free once its W is on the stream.
    const int slots = peak_in_flight(*ops, ch) + (u->shape_.chunks() > 1 ? 1 : 0);
    const int stashes = stashes_for(par, *ops, ch);
    u->chunks_.push_back(spec.factory
                             ? spec.factory({.config = c,
                                             .B = o.micro_batch,
                                             .spec = stage,
                                             .slots = slots,
                                             .stashes = stashes,
                                             .stage = u->coord_.s,
                                             .tp = tensor.slice})
                             : std::make_unique<GptStage>(c, o.micro_batch, stage, slots, dev,
                                                          tensor, o.activations, stashes));
  }
  // (Mixed precision: the parameters, loaded or made, are bf16/fp16; the
  // partitions' masters start from them, as the single-rank loop's.)
  if (absl::Status st = u->init_params(); !st.ok()) return st;
  const std::int64_t before = dev.allocated_bytes();
  for (const auto& chunk : u->chunks_) {
    u->partitions_.push_back(std::make_unique<Partition>(*chunk, par.dp, u->coord_.d,
                                                         u->coord_.t == 0, *u->optimizer_stream_,
                                                         o.activations.precision));
  }
  u->optimizer_bytes_ = dev.allocated_bytes() - before;
  if (spec.load != nullptr && spec.load_optimizer) {
    // The partitions' master copies began as the parameters; now the
    // checkpoint's own state, wherever its old partitions put it.
    if (absl::Status st = u->state_to_host(); !st.ok()) return st;
    for (const model::ckpt::Piece& p : u->checkpoint_pieces()) {
      if (p.kind == model::ckpt::Kind::kParam) continue;
      if (absl::Status st = spec.load->fill(p); !st.ok()) return st;
    }
    if (absl::Status st = u->optimizer_state_to_device(); !st.ok()) return st;
  }
  if (absl::Status st = u->optimizer_stream_->synchronize(); !st.ok()) return st;
  u->allocated_bytes_ = dev.allocated_bytes() - at_start;
  return u;
}

RankUnit::ActivationBytes RankUnit::activation_bytes() const {
  ActivationBytes out;
  for (const auto& chunk : chunks_) {
    out.per_micro_batch += chunk->activation_bytes_per_slot();
    out.workspace += chunk->recompute_workspace_bytes();
  }
  return out;
}

absl::Status RankUnit::init_params() {
  const model::TrainOptions& o = spec_.options;
  if (spec_.load != nullptr) {
    // Every chunk's slice, the tied head's wte copy included.
    for (auto& chunk : chunks_) {
      absl::Status st = with_host_copy(chunk->params(), /*write_back=*/true, [&](float* host) {
        return spec_.load->fill({.kind = model::ckpt::Kind::kParam,
                                 .layout = &chunk->layout(),
                                 .begin = 0,
                                 .end = chunk->layout().total(),
                                 .data = host});
      });
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (o.init_weights.empty()) {
    for (auto& chunk : chunks_) {
      if (absl::Status st = chunk->gpt().init(o.seed); !st.ok()) return st;  // counter-based
    }
    return absl::OkStatus();
  }
  // From a file: each chunk reads its own tensors only.
  for (auto& chunk : chunks_) {
    absl::Status st = with_host_copy(chunk->params(), /*write_back=*/true, [&](float* host) {
      return model::load_weights_slice(o.init_weights, o.model, chunk->layout(), host);
    });
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

RankUnit::Actors RankUnit::spawn(caf::actor_system& system, const Wiring& wiring) {
  const ParallelOptions& par = spec_.parallel;
  const model::TrainOptions& o = spec_.options;
  ShardSetup ss;
  ss.rank = spec_.rank;
  ss.coord = coord_;
  ss.layout = par.layout();
  ss.shape = shape_;
  ss.schedule = par.schedule;
  ss.m = par.m(o);
  ss.B = o.micro_batch;
  ss.T = o.model.T;
  ss.global_batch = o.global_batch;
  ss.batches = o.batches();
  ss.data = wiring.train;
  ss.valid = wiring.valid;
  for (auto& c : chunks_) ss.chunks.push_back(c.get());
  ss.stream = stream_.get();
  ss.transport = transport_.get();
  ss.links = links_.get();
  ss.grad_pieces = grad_pieces_;
  ss.param_pieces = param_pieces_;
  ss.coordinator = wiring.coordinator;
  ss.fail = par.fail;
  ss.trace = trace_.get();

  OptimizerSetup os;
  os.rank = spec_.rank;
  os.coord = coord_;
  os.layout = par.layout();
  os.shape = shape_;
  for (auto& p : partitions_) os.partitions.push_back(p.get());
  for (auto& c : chunks_) os.chunks.push_back(c.get());
  os.stream = optimizer_stream_;
  os.transport = transport_.get();
  os.adam = o.adam;
  os.grad_pieces = grad_pieces_;
  os.param_pieces = param_pieces_;
  os.coordinator = wiring.coordinator;
  os.trace = trace_.get();
  os.save = [this, coordinator = wiring.coordinator](int step, const std::string& tmp) {
    return save(tmp, [coordinator, step,
                      rank = spec_.rank](absl::StatusOr<std::vector<model::ckpt::TensorRecord>> r) {
      // (From the writer's thread: to the coordinator, or its stand-in.)
      if (r.ok()) {
        caf::anon_send(coordinator, saved_atom::value, step, rank, model::ckpt::records_to_text(*r),
                       std::string());
      } else {
        caf::anon_send(coordinator, saved_atom::value, step, rank, std::string(),
                       std::string(r.status().message()));
      }
    });
  };
  if (dp_device_ || dp_alone_) {  // the ZeRO-1 pieces device to device
    for (auto& p : partitions_) {
      p->set_pieces_on_device();
      ss.partitions.push_back(p.get());
    }
    ss.dp = os.dp = dp_device_.get();
    ss.dp_alone = os.dp_alone = dp_alone_;
    ss.dp_reduced = os.dp_reduced = dp_reduced_.get();
    ss.dp_params = os.dp_params = dp_params_.get();
  }
  // The shard's constructor allocates its micro-batches' token buffers.
  const std::int64_t before = stream_->device().allocated_bytes();
  Actors spawned;
  spawned.optimizer = system.spawn<OptimizerActor>(std::move(os));
  ss.optimizer = spawned.optimizer.address();
  spawned.shard = system.spawn<ShardActor>(std::move(ss));
  // (Before any step: the coordinator's first message comes after this.)
  caf::anon_send(spawned.optimizer, shard_atom::value, spawned.shard);
  allocated_bytes_ += stream_->device().allocated_bytes() - before;
  return spawned;
}

absl::Status RankUnit::write_trace(const std::string& dir, TraceHeader header) const {
  header.rank = spec_.rank;
  header.coord = coord_;
  header.layout = spec_.parallel.layout();
  header.virtual_stages = spec_.parallel.virtual_stages;
  header.schedule = spec_.parallel.schedule;
  header.m = spec_.parallel.m(spec_.options);
  if (header.host.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    header.host = host;
  }
  if (header.pid == 0) header.pid = static_cast<int>(getpid());
  // At a run's end every send has been received, but a sender's completion
  // may still be on its way (the receiver's can come first): wait for it
  // (briefly) so that the trace does not show it open.
  if (header.reason == "end") {
    for (int i = 0; i < 2000 && recorder_->has_open(comm::trace::Kind::kSend); i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return write_trace_file(dir, header, *recorder_);
}

void RankUnit::end_pending(const absl::Status& why) {
  for (int peer = 0; peer < transport_->size(); peer++) transport_->fail_peer(peer, why);
  if (tensor_) tensor_->fail(why);          // a stream waiting in a TP collective goes on
  if (data_group_) data_group_->fail(why);  // or in a DP one
  connect_cancelled_ = true;
}

void RankUnit::fail_pending(const absl::Status& why) {
  end_pending(why);
  if (comm::Collectives* nccl = nccl_.load(); nccl != nullptr) {
    nccl->fail(why);     // its kernels end once it is aborted, their results garbage:
    stream_->fail(why);  // the stream says so
  }
  if (comm::Collectives* nccl = dp_nccl_.load(); nccl != nullptr) {
    nccl->fail(why);  // the same for the DP group's, which both streams call
    stream_->fail(why);
    optimizer_stream_->fail(why);
  }
  std::lock_guard<std::mutex> lock(links_mu_);
  if (!link_nccl_.empty()) {
    for (comm::Collectives* nccl : link_nccl_) nccl->fail(why);  // (as the TP group's)
    links_->fail(why);
    stream_->fail(why);
  }
}

void RankUnit::drain() {
  // A checkpoint write still running (the run failed during a save) ends
  // first: its report must not reach an actor system that is gone.
  writer_.wait();
  if (stream_) (void)stream_->synchronize();
  if (links_) links_->synchronize();
  if (optimizer_stream_) (void)optimizer_stream_->synchronize();
}

RankUnit::~RankUnit() {
  drain();
  tp_device_.reset();  // its NCCL communicator, while the stream it fails is alive
  dp_device_.reset();
  links_.reset();  // theirs too
}

std::vector<model::ckpt::Piece> RankUnit::checkpoint_pieces() {
  if (state_.empty()) {
    for (std::size_t c = 0; c < chunks_.size(); c++) {
      const Partition& part = *partitions_[c];
      state_.push_back({gpu::HostMirror(chunks_[c]->params()), gpu::HostMirror(part.master()),
                        gpu::HostMirror(part.adam_m()), gpu::HostMirror(part.adam_v())});
      // bf16/fp16 parameters reach the checkpoint widened (state_to_host).
      const gpu::Tensor& p = chunks_[c]->params();
      param_values_.emplace_back(p.dtype == gpu::DType::kF32 ? 0
                                                             : static_cast<std::size_t>(p.numel()));
    }
  }
  std::vector<CheckpointChunk> chunks;
  for (std::size_t c = 0; c < chunks_.size(); c++) {
    const std::array<gpu::HostMirror, 4>& st = state_[c];
    chunks.push_back(
        {.layout = &chunks_[c]->layout(),
         .spec = chunks_[c]->spec(),
         .params = param_values_[c].empty() ? st[0].host_data<float>() : param_values_[c].data(),
         .master = st[1].host_data<float>(),
         .adam_m = st[2].host_data<float>(),
         .adam_v = st[3].host_data<float>()});
  }
  return actors::checkpoint_pieces(chunks, coord_, spec_.parallel.dp);
}

absl::Status RankUnit::state_to_host() {
  (void)checkpoint_pieces();  // (makes the mirrors)
  if (absl::Status st = stream_->synchronize(); !st.ok()) return st;
  if (absl::Status st = optimizer_stream_->synchronize(); !st.ok()) return st;
  for (const auto& st : state_) {
    for (const gpu::HostMirror& m : st) m.to_host(*optimizer_stream_);
  }
  for (std::size_t c = 0; c < chunks_.size(); c++) {
    if (param_values_[c].empty()) continue;
    absl::Status st = gpu::copy_values_to_host(chunks_[c]->params(), param_values_[c]);
    if (!st.ok()) return st;
  }
  return optimizer_stream_->synchronize();
}

absl::Status RankUnit::optimizer_state_to_device() {
  (void)checkpoint_pieces();
  for (const auto& st : state_) {
    for (std::size_t i = 1; i < st.size(); i++) st[i].to_device(*optimizer_stream_);  // not [0]
  }
  return optimizer_stream_->synchronize();
}

absl::Status RankUnit::save(const std::string& tmp_dir, SaveDone done) {
  // A step boundary: the last step's updates and parameters are in, and
  // nothing of the next is queued (state_to_host's syncs return at once on
  // the CPU, where it copies nothing).
  if (absl::Status st = state_to_host(); !st.ok()) return st;
  writer_.wait();  // (the coordinator has committed the save before)
  // (The writer is done with the last save's copy: its memory is reused.)
  if (!snapshot_) snapshot_ = std::make_shared<model::ckpt::Snapshot>();
  snapshot_->retake(checkpoint_pieces());
  std::shared_ptr<const model::ckpt::Snapshot> snap = snapshot_;
  writer_.start([snap, tmp_dir, rank = spec_.rank, done = std::move(done)] {
    done(model::ckpt::write_rank_file(tmp_dir, rank, snap->pieces()));
  });
  return absl::OkStatus();
}

std::int64_t RankUnit::optimizer_state_bytes() const {
  std::int64_t n = 0;
  for (const auto& p : partitions_) n += p->state_bytes();
  return n;
}

std::vector<model::ckpt::Piece> checkpoint_pieces(const std::vector<CheckpointChunk>& chunks,
                                                  const comm::Coord& coord, int dp) {
  std::vector<model::ckpt::Piece> out;
  for (const CheckpointChunk& c : chunks) {
    const Range part = partition_range(*c.layout, c.spec, dp, coord.d);
    model::ckpt::add_chunk_pieces(*c.layout, wte_elsewhere(c.spec), /*params=*/coord.d == 0,
                                  part.begin, part.end, c.params, c.master, c.adam_m, c.adam_v,
                                  &out);
  }
  return out;
}

void configure_actor_system(caf::actor_system_config& cfg) {
  add_message_types(cfg);
  // (What the program set already, from its code, a file or its command
  // line, stays: an embedding host's own choice.)
  auto set = [&](const char* name, std::size_t value) {
    if (caf::get_if(&caf::content(cfg), name) == nullptr) cfg.set(name, value);
  };
  // Actors only react to messages; compute runs on the ranks' streams. Two
  // workers, not CAF's default of at least four: a message sent with no
  // execution unit (anon_send: every stream's and transport's callback)
  // goes to the next worker in turn and wakes it (docs/ARCHITECTURE.md).
  set("scheduler.max-threads", 2);
  // An idle worker goes straight from its short busy poll to a condition
  // variable that a new message wakes, instead of polling every 50 us for
  // 25 ms: a pipeline hop crosses two actors, and each such nap was on the
  // critical path (scripts/bench pipeline).
  set("work-stealing.moderate-poll-attempts", 0);
}

void stop_actors(caf::actor_system& system, const std::vector<caf::actor>& actors) {
  caf::scoped_actor self{system};
  for (const caf::actor& a : actors) {
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  for (std::size_t i = 0; i < actors.size(); i++) {
    self->receive([](const caf::down_msg&) {});
  }
}

absl::Status copy_slice_into_whole(const model::ParamLayout& layout, const float* params,
                                   model::Gpt& whole) {
  for (const model::ParamSpec& spec : layout.specs()) {
    // Each TP rank's slice to its place in the unsliced tensor.
    const model::ParamSpec* to = whole.layout().find_or_null(spec.name);
    if (to == nullptr || to->shape != spec.full_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gathering the weights: the model has no tensor ", spec.name, " of this size"));
    }
    float* dst = whole.params().host<float>() + to->offset;
    const float* src = params + spec.offset;
    for (std::int64_t i = 0; i < spec.numel(); i++) dst[spec.global_index(i)] = src[i];
  }
  return absl::OkStatus();
}

absl::Status copy_into_whole(const std::vector<const GptStage*>& chunks, model::Gpt& whole) {
  for (const GptStage* chunk : chunks) {
    absl::Status st = with_host_copy(chunk->params(), /*write_back=*/false, [&](float* host) {
      return copy_slice_into_whole(chunk->layout(), host, whole);
    });
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status with_host_copy(const gpu::Tensor& t, bool write_back,
                            const std::function<absl::Status(float*)>& use) {
  if (t.host_readable() && t.dtype == gpu::DType::kF32) return use(t.host<float>());
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  if (absl::Status st = gpu::copy_values_to_host(t, host); !st.ok()) return st;
  if (absl::Status st = use(host.data()); !st.ok()) return st;
  return write_back ? gpu::copy_values_to_device(host, t) : absl::OkStatus();
}

}  // namespace troupe::actors
