// All ranks as actors in one process.
#include "actors/runtime/in_process.h"

#include <algorithm>
#include <future>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "actors/coordinator.h"
#include "actors/messages.h"

namespace troupe::actors {

absl::StatusOr<std::unique_ptr<InProcessTrainer>> InProcessTrainer::create(
    const model::TrainOptions& options, const ParallelOptions& parallel,
    const StageFactory& factory, const RunCheckpoints& checkpoints, const TraceOptions& trace) {
  if (absl::Status st = parallel.validate(options); !st.ok()) return st;
  if (parallel.tp > 1 && parallel.device != nullptr &&
      parallel.device->kind() == gpu::DeviceKind::kCuda) {
    // (Its ranks would share the one GPU, and NCCL takes a GPU per member.)
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", parallel.tp, " on ", parallel.device->name(),
        " in one process: the TP group's NCCL communicator needs a GPU per rank; run it with "
        "troupe launch (a process and a GPU per rank)"));
  }
  std::unique_ptr<InProcessTrainer> t(new InProcessTrainer());
  t->options_ = options;
  t->options_.model = parallel.sliced_config(options.model);
  t->parallel_ = parallel;
  t->checkpoints_ = checkpoints;
  t->trace_ = trace;
  t->layout_ = parallel.layout();
  t->shape_ = parallel.layout();

  auto datasets = model::build_run_datasets(t->options_);
  if (!datasets.ok()) return datasets.status();
  t->data_ = std::move(*datasets);

  // Each rank's compute stream gets a fixed share of the cores, so a layout
  // runs the same way every time.
  const int world = t->layout_.world();
  const int cores = options.threads > 0
                        ? options.threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  t->fabric_ = std::make_shared<comm::InProcFabric>(world);
  for (int r = 0; r < world; r++) {
    RankSpec spec{.options = t->options_,
                  .parallel = parallel,
                  .rank = r,
                  .threads = std::max(1, cores / world),
                  .factory = factory,
                  .load = checkpoints.loaded,
                  .load_optimizer = checkpoints.flags.load_optim,
                  .trace = trace};
    absl::StatusOr<std::unique_ptr<RankUnit>> unit =
        RankUnit::create(spec, t->fabric_->endpoint(r));
    if (!unit.ok()) return unit.status();
    t->ranks_.push_back(*std::move(unit));
  }
  if (absl::Status st = t->connect_ranks(); !st.ok()) return st;
  return t;
}

// What needs the peers (RankUnit::connect): the members of a group meet
// in it, so a thread each; one that fails (or cannot start) ends the
// others', and every thread started is waited for.
absl::Status InProcessTrainer::connect_ranks() {
  auto fail_all = [this](const absl::Status& why) {
    for (auto& r : ranks_) r->fail_pending(why);
  };
  std::vector<std::future<absl::Status>> connected;
  absl::Status first = absl::OkStatus();
  try {
    for (auto& r : ranks_) {
      connected.push_back(std::async(std::launch::async, [&fail_all, unit = r.get()] {
        absl::Status st;
        try {
          st = unit->connect();
        } catch (const std::exception& e) {
          st = absl::InternalError(absl::StrCat("connecting rank ", unit->rank(), ": ", e.what()));
        }
        if (!st.ok()) fail_all(st);
        return st;
      }));
    }
  } catch (const std::system_error& e) {  // no thread for one more rank
    first = absl::ResourceExhaustedError(
        absl::StrCat("a thread to connect rank ", connected.size(), ": ", e.what()));
    fail_all(first);
  }
  for (auto& c : connected) {
    if (absl::Status st = c.get(); !st.ok() && first.ok()) first = st;
  }
  return first;
}

InProcessTrainer::~InProcessTrainer() {
  for (auto& r : ranks_) r->drain();
  // A completion still queued on the fabric's thread (a parameter send's,
  // which no actor waits for before the run ends) closes its trace event
  // in its rank's recorder: it runs before the ranks go (seen as a hang,
  // a freed recorder's mutex, in examples/two_jobs).
  if (fabric_) fabric_->drain();
}

absl::Status InProcessTrainer::run(const StepCallback& on_step) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system system{cfg};
  return run(system, on_step);
}

absl::Status InProcessTrainer::run(caf::actor_system& system, const StepCallback& on_step,
                                   const std::function<void(const caf::actor&)>& on_started) {
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
  set_checkpoints(setup.get(), checkpoints_, parallel_);
  caf::actor coordinator = system.spawn<Coordinator>(setup);

  std::vector<caf::actor> all{coordinator};
  for (auto& r : ranks_) {
    RankUnit::Actors a = r->spawn(
        system,
        {.coordinator = coordinator, .train = data_.train.get(), .valid = data_.valid.get()});
    setup->shards.push_back(a.shard);
    setup->optimizers.push_back(a.optimizer);
    all.push_back(a.shard);
    all.push_back(a.optimizer);
  }
  caf::anon_send(coordinator, start_atom::value);
  if (on_started) on_started(coordinator);
  absl::Status st = finished.get();
  // Before the shutdown fails what is pending: the flight recorder shows
  // what each rank was in the middle of.
  st = finish_traces(std::move(st));
  shut_down(system, all);
  return st;
}

absl::Status InProcessTrainer::write_traces(const std::string& dir, const std::string& reason,
                                            const std::string& message) const {
  for (const auto& r : ranks_) {
    TraceHeader header;
    header.reason = reason;
    header.message = message;
    if (absl::Status st = r->write_trace(dir, header); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// The end of a run: --trace writes its files; a failure or a stall writes
// the flight recorder and names it in the error.
absl::Status InProcessTrainer::finish_traces(absl::Status st) const {
  if (st.ok()) {
    if (trace_.dir.empty()) return st;
    absl::Status written = write_traces(trace_.dir, "end");
    if (!written.ok())
      return absl::Status(written.code(), absl::StrCat("--trace: ", written.message()));
    return st;
  }
  const std::string dir = trace_.failure_dir();
  const char* reason = absl::IsDeadlineExceeded(st) ? "stall" : "failure";
  absl::Status written = write_traces(dir, reason, std::string(st.message()));
  return absl::Status(st.code(), absl::StrCat(st.message(), "\n", flight_note(dir, written)));
}

void InProcessTrainer::shut_down(caf::actor_system& system, const std::vector<caf::actor>& actors) {
  // Nothing pending may outlive the run: fail every transport operation
  // (an error completion to an actor about to exit), then stop the actors,
  // then let the streams drain.
  const absl::Status over = absl::CancelledError("the run has ended");
  for (auto& r : ranks_) r->fail_pending(over);
  stop_actors(system, actors);
  for (auto& r : ranks_) r->drain();
}

absl::Status InProcessTrainer::gather_params(model::Gpt& whole) const {
  std::vector<const GptStage*> chunks;
  for (const auto& r : ranks_) {
    if (r->coord().d != 0) continue;
    for (const auto& c : r->chunks()) chunks.push_back(c.get());
  }
  return copy_into_whole(chunks, whole);
}

std::int64_t InProcessTrainer::optimizer_state_bytes(int rank) const {
  return ranks_[static_cast<std::size_t>(rank)]->optimizer_state_bytes();
}

std::int64_t InProcessTrainer::allocated_bytes(int rank) const {
  return ranks_[static_cast<std::size_t>(rank)]->allocated_bytes();
}

std::int64_t InProcessTrainer::optimizer_bytes(int rank) const {
  return ranks_[static_cast<std::size_t>(rank)]->optimizer_bytes();
}

std::int64_t InProcessTrainer::unpartitioned_state_bytes() const {
  return 3 * model::ParamLayout::gpt(options_.model).total() * 4;
}

std::int64_t InProcessTrainer::tp_all_reduced_floats(int rank) const {
  return ranks_[static_cast<std::size_t>(rank)]->tp_all_reduced_floats();
}

int InProcessTrainer::slots(int rank, int chunk) const {
  return ranks_[static_cast<std::size_t>(rank)]->chunks()[static_cast<std::size_t>(chunk)]->slots();
}

int InProcessTrainer::stashes(int rank, int chunk) const {
  return ranks_[static_cast<std::size_t>(rank)]
      ->chunks()[static_cast<std::size_t>(chunk)]
      ->stashes();
}

}  // namespace troupe::actors
