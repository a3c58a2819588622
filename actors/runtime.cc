// All ranks as actors in one process.
#include "actors/runtime.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "actors/coordinator.h"
#include "actors/messages.h"
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
  if (virtual_stages > 1 && schedule != ScheduleKind::kInterleaved1F1B) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual-stages ", virtual_stages, " needs --schedule interleaved"));
  }
  if (absl::Status st = check_layer_split(o.model.L, pp, virtual_stages); !st.ok()) return st;
  if (o.global_batch % (o.micro_batch * dp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global-batch-size ", o.global_batch, " must be a multiple of --micro-batch-size ",
        o.micro_batch, " x --dp ", dp, " = ", o.micro_batch * dp));
  }
  const PipelineShape shape{pp, virtual_stages, dp, tp};
  if (absl::Status st = check_pipeline_shape(o.model, shape, m(o)); !st.ok()) return st;
  for (int s = 0; s < pp; s++) {
    auto ops = make_schedule(schedule, pp, s, m(o), virtual_stages);
    if (!ops.ok()) return ops.status();
  }
  return absl::OkStatus();
}

namespace {

// Most micro-batches chunk c of stage s holds between forward and backward.
int peak_in_flight(const std::vector<ScheduleOp>& ops, int chunk) {
  int now = 0, peak = 0;
  for (const ScheduleOp& op : ops) {
    if (op.chunk != chunk) continue;
    now += op.kind == OpKind::kForward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessTrainer>> InProcessTrainer::create(
    const model::TrainOptions& options, const ParallelOptions& parallel,
    const StageFactory& factory) {
  if (absl::Status st = parallel.validate(options); !st.ok()) return st;
  std::unique_ptr<InProcessTrainer> t(new InProcessTrainer());
  t->options_ = options;
  t->options_.model = parallel.sliced_config(options.model);
  t->parallel_ = parallel;
  t->layout_ = {.tp = parallel.tp, .pp = parallel.pp, .dp = parallel.dp};
  t->shape_ = {parallel.pp, parallel.virtual_stages, parallel.dp, parallel.tp};
  const model::GptConfig& c = t->options_.model;

  auto datasets = model::build_run_datasets(t->options_);
  if (!datasets.ok()) return datasets.status();
  t->data_ = std::move(*datasets);

  // Each rank's compute stream gets a fixed share of the cores, so a layout
  // runs the same way every time.
  const int world = t->layout_.world();
  const int cores = options.threads > 0
                        ? options.threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / world);
  gpu::Device& dev = gpu::cpu_device();
  t->fabric_ = std::make_shared<comm::InProcFabric>(world);
  t->grad_pieces_ = grad_pieces(c, t->shape_);
  t->param_pieces_ = param_pieces(c, t->shape_);
  t->ranks_.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; r++) {
    Rank& rk = t->ranks_[static_cast<std::size_t>(r)];
    rk.rank = r;
    rk.coord = t->layout_.coord(r);
    rk.transport = t->fabric_->endpoint(r);
    model::TensorParallel tensor;
    tensor.slice = {parallel.tp, rk.coord.t};
    if (parallel.tp > 1) {
      rk.tensor = std::make_unique<comm::Communicator>(
          *rk.transport, t->layout_.tensor_group(r), comm::GroupKind::kTensor);
      tensor.all_reduce = [comm = rk.tensor.get(), count = rk.tp_floats](gpu::Stream& s,
                                                                         const gpu::Tensor& x) {
        *count += x.numel();
        // In stream order: the stream waits while the peers add their parts.
        s.host_callback([&s, comm, x] {
          absl::Status st = comm->all_reduce_sync(x.data<float>(), static_cast<std::size_t>(x.numel()));
          if (!st.ok()) s.fail(absl::UnavailableError(absl::StrCat("TP all-reduce: ", st.message())));
        });
      };
      tensor.all_gather = [comm = rk.tensor.get()](gpu::Stream& s, const gpu::Tensor& in,
                                                    const gpu::Tensor& out) {
        s.host_callback([&s, comm, in, out] {
          absl::Status st = comm->all_gather_sync(in.data<float>(), out.data<float>(),
                                                  static_cast<std::size_t>(out.numel()));
          if (!st.ok()) s.fail(absl::UnavailableError(absl::StrCat("TP all-gather: ", st.message())));
        });
      };
    }
    rk.stream = dev.make_stream({.threads = threads});
    rk.optimizer_stream = dev.make_stream({.threads = 1});
    const std::vector<ScheduleOp> ops = *make_schedule(parallel.schedule, parallel.pp, rk.coord.s,
                                                       parallel.m(options), parallel.virtual_stages);
    for (int ch = 0; ch < parallel.virtual_stages; ch++) {
      const model::StageSpec spec = chunk_spec(c, t->shape_, virtual_stage(t->shape_, rk.coord.s, ch));
      // One more slot than the schedule's peak when there are neighbours, so
      // a micro-batch whose gradient is still leaving does not hold up the
      // next forward.
      const int slots = peak_in_flight(ops, ch) + (t->shape_.chunks() > 1 ? 1 : 0);
      rk.chunks.push_back(factory ? factory(c, options.micro_batch, spec, slots)
                                  : std::make_unique<GptStage>(c, options.micro_batch, spec, slots,
                                                               dev, tensor));
    }
    if (absl::Status st = t->init_params(rk); !st.ok()) return st;
    const std::int64_t before = dev.allocated_bytes();
    for (const auto& chunk : rk.chunks) {
      rk.partitions.push_back(std::make_unique<Partition>(*chunk, parallel.dp, rk.coord.d,
                                                          rk.coord.t == 0, *rk.optimizer_stream));
    }
    rk.optimizer_bytes = dev.allocated_bytes() - before;
    if (absl::Status st = rk.optimizer_stream->synchronize(); !st.ok()) return st;
  }
  return t;
}

absl::Status InProcessTrainer::init_params(Rank& r) {
  if (options_.init_weights.empty()) {
    for (auto& chunk : r.chunks) chunk->gpt().init(options_.seed);  // counter-based: a slice alone
    return absl::OkStatus();
  }
  // From a file: load the whole model once (per rank; fine in one process),
  // then copy each chunk's tensors by name.
  model::Gpt whole(options_.model, 1, gpu::cpu_device());
  if (absl::Status st = model::load_weights(options_.init_weights, whole); !st.ok()) return st;
  for (auto& chunk : r.chunks) {
    for (const model::ParamSpec& spec : chunk->layout().specs()) {
      absl::StatusOr<const model::ParamSpec*> found = whole.layout().lookup(spec.name);
      if (!found.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(options_.init_weights, ": ", found.status().message()));
      }
      const model::ParamSpec& from = **found;
      float* to = chunk->params().data<float>() + spec.offset;
      const float* src = whole.params().data<float>() + from.offset;
      for (std::int64_t i = 0; i < spec.numel(); i++) to[i] = src[spec.global_index(i)];
    }
  }
  return absl::OkStatus();
}

InProcessTrainer::~InProcessTrainer() {
  for (Rank& r : ranks_) {
    if (r.stream) (void)r.stream->synchronize();
    if (r.optimizer_stream) (void)r.optimizer_stream->synchronize();
  }
}

absl::Status InProcessTrainer::run(const StepCallback& on_step) {
  caf::actor_system_config cfg;
  add_message_types(cfg);
  // Actors only react to messages; compute runs on the ranks' streams.
  cfg.set("scheduler.max-threads", 2);
  // An idle worker goes straight from its short busy poll to a condition
  // variable that a new message wakes, instead of polling every 50 us for
  // 25 ms: a pipeline hop crosses two actors, and each such nap was on the
  // critical path (scripts/bench pipeline).
  cfg.set("work-stealing.moderate-poll-attempts", 0);
  caf::actor_system system{cfg};
  return run(system, on_step);
}

absl::Status InProcessTrainer::run(caf::actor_system& system, const StepCallback& on_step) {
  if (ran_) return absl::FailedPreconditionError("InProcessTrainer::run: already ran");
  ran_ = true;
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> finished = done->get_future();
  auto setup = std::make_shared<CoordinatorSetup>();
  setup->options = options_;
  setup->layout = layout_;
  setup->shape = shape_;
  setup->m = parallel_.m(options_);
  setup->has_valid = data_.valid != nullptr;
  setup->stall_timeout_s = parallel_.stall_timeout_s;
  setup->on_step = on_step;
  setup->on_finish = [done](absl::Status st) { done->set_value(std::move(st)); };
  caf::actor coordinator = system.spawn<Coordinator>(setup);

  std::vector<caf::actor> all{coordinator};
  for (Rank& r : ranks_) {
    ShardSetup ss;
    ss.rank = r.rank;
    ss.coord = r.coord;
    ss.layout = layout_;
    ss.shape = shape_;
    ss.schedule = parallel_.schedule;
    ss.m = parallel_.m(options_);
    ss.B = options_.micro_batch;
    ss.T = options_.model.T;
    ss.global_batch = options_.global_batch;
    ss.data = data_.train.get();
    ss.valid = data_.valid.get();
    for (auto& c : r.chunks) ss.chunks.push_back(c.get());
    ss.stream = r.stream.get();
    ss.transport = r.transport.get();
    ss.grad_pieces = grad_pieces_;
    ss.param_pieces = param_pieces_;
    ss.coordinator = coordinator;
    ss.fail = parallel_.fail;
    setup->shards.push_back(system.spawn<ShardActor>(std::move(ss)));

    OptimizerSetup os;
    os.rank = r.rank;
    os.coord = r.coord;
    os.layout = layout_;
    os.shape = shape_;
    for (auto& p : r.partitions) os.partitions.push_back(p.get());
    os.stream = r.optimizer_stream.get();
    os.transport = r.transport.get();
    os.adam = options_.adam;
    os.grad_pieces = grad_pieces_;
    os.param_pieces = param_pieces_;
    os.coordinator = coordinator;
    setup->optimizers.push_back(system.spawn<OptimizerActor>(std::move(os)));
    all.push_back(setup->shards.back());
    all.push_back(setup->optimizers.back());
  }
  caf::anon_send(coordinator, start_atom::value);
  absl::Status st = finished.get();
  shut_down(system, all);
  return st;
}

void InProcessTrainer::shut_down(caf::actor_system& system, const std::vector<caf::actor>& actors) {
  // Nothing pending may outlive the run: fail every transport operation
  // (an error completion to an actor about to exit), then stop the actors,
  // then let the streams drain.
  const absl::Status over = absl::CancelledError("the run has ended");
  for (Rank& r : ranks_) {
    for (int peer = 0; peer < layout_.world(); peer++) r.transport->fail_peer(peer, over);
    if (r.tensor) r.tensor->fail(over);  // a stream waiting in a TP collective goes on
  }
  caf::scoped_actor self{system};
  for (const caf::actor& a : actors) {
    self->monitor(a);
    self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  for (std::size_t i = 0; i < actors.size(); i++) {
    self->receive([](const caf::down_msg&) {});
  }
  for (Rank& r : ranks_) {
    (void)r.stream->synchronize();
    (void)r.optimizer_stream->synchronize();
  }
}

absl::Status InProcessTrainer::gather_params(model::Gpt& whole) const {
  for (const Rank& r : ranks_) {
    if (r.coord.d != 0) continue;
    for (const auto& chunk : r.chunks) {
      for (const model::ParamSpec& spec : chunk->layout().specs()) {
        // Each TP rank's slice to its place in the unsliced tensor.
        const model::ParamSpec* to = whole.layout().find_or_null(spec.name);
        if (to == nullptr || to->shape != spec.full_shape) {
          return absl::InvalidArgumentError(
              absl::StrCat("gather_params: the model has no tensor ", spec.name, " of this size"));
        }
        float* dst = whole.params().data<float>() + to->offset;
        const float* src = chunk->params().data<float>() + spec.offset;
        for (std::int64_t i = 0; i < spec.numel(); i++) dst[spec.global_index(i)] = src[i];
      }
    }
  }
  return absl::OkStatus();
}

std::int64_t InProcessTrainer::optimizer_state_bytes(int rank) const {
  std::int64_t n = 0;
  for (const auto& p : ranks_[static_cast<std::size_t>(rank)].partitions) n += p->state_bytes();
  return n;
}

std::int64_t InProcessTrainer::optimizer_bytes(int rank) const {
  return ranks_[static_cast<std::size_t>(rank)].optimizer_bytes;
}

std::int64_t InProcessTrainer::unpartitioned_state_bytes() const {
  return 3 * model::ParamLayout::gpt(options_.model).total() * 4;
}

std::int64_t InProcessTrainer::tp_all_reduced_floats(int rank) const {
  return ranks_[static_cast<std::size_t>(rank)].tp_floats->load();
}

int InProcessTrainer::slots(int rank, int chunk) const {
  return ranks_[static_cast<std::size_t>(rank)].chunks[static_cast<std::size_t>(chunk)]->slots();
}

}  // namespace troupe::actors
