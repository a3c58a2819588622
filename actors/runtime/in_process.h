// Training with every rank as actors in one process: the in-process
// transport carries activations, gradients and parameters between them;
// one CAF actor system hosts a ShardActor and an OptimizerActor per rank
// and the Coordinator. This is what `troupe train --pp P --dp D` runs.
//
// Each rank is a RankUnit (actors/rank/rank.h), the same unit a worker process
// runs; its buffers, streams and transports outlive the actors, so a run ends in a fixed order: the
// coordinator finishes, the transports fail what is pending, the actors exit, the streams drain.
//
//   auto t = actors::InProcessTrainer::create(options, {.pp = 2, .dp = 2});
//   RETURN_IF_ERROR((*t)->run([](const model::StepMetrics& m) { ... }));
//   RETURN_IF_ERROR((*t)->gather_params(whole_gpt));     // e.g. to save it
#pragma once

#include <atomic>
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/rank/rank.h"
#include "actors/rank/stage_compute.h"
#include "actors/schedule.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "comm/inproc_transport.h"
#include "model/data/datasets.h"
#include "model/trainer.h"

namespace troupe::actors {

class InProcessTrainer {
 public:
  using StageFactory = actors::StageFactory;

  static absl::StatusOr<std::unique_ptr<InProcessTrainer>> create(
      const model::TrainOptions& options, const ParallelOptions& parallel,
      const StageFactory& factory = nullptr, const RunCheckpoints& checkpoints = {},
      const TraceOptions& trace = {});
  ~InProcessTrainer();

  using StepCallback = std::function<void(const model::StepMetrics&)>;
  // Runs options.steps steps (once per object) in its own actor system, or
  // in `system` (whose config must have had add_message_types()).
  absl::Status run(const StepCallback& on_step);
  // `on_started` gets the coordinator once the run's actors are spawned:
  // a host may send it stop_atom and save_now_atom (actors/messages.h).
  absl::Status run(caf::actor_system& system, const StepCallback& on_step,
                   const std::function<void(const caf::actor&)>& on_started = nullptr);

  // Writes every rank's trace file into `dir` (any thread, any time: a
  // SIGUSR1 handler's thread may call it while the run goes on).
  absl::Status write_traces(const std::string& dir, const std::string& reason,
                            const std::string& message = "") const;
  const TraceOptions& trace() const { return trace_; }

  // Replica 0's parameters of every stage, copied by name into `whole`
  // (a model::Gpt of the whole model), e.g. to save them.
  absl::Status gather_params(model::Gpt& whole) const;

  const model::TrainOptions& options() const { return options_; }
  const ParallelOptions& parallel() const { return parallel_; }
  const comm::Layout& layout() const { return layout_; }
  const model::data::SampleSource& train_data() const { return *data_.train; }
  const model::data::SampleSource* valid_data() const { return data_.valid.get(); }
  // Bytes of optimizer state (master copy, Adam moments) rank r holds, and
  // what one rank would hold for the whole model.
  std::int64_t optimizer_state_bytes(int rank) const;
  std::int64_t unpartitioned_state_bytes() const;
  // Device bytes rank `rank` allocated (RankUnit::allocated_bytes; the
  // token buffers once run() has spawned its actors).
  std::int64_t allocated_bytes(int rank) const;
  // Every byte the optimizer side of rank r allocated (state, the sum of the
  // replicas, the staging window, norms), as the device counted it.
  std::int64_t optimizer_bytes(int rank) const;
  int slots(int rank, int chunk) const;
  int stashes(int rank, int chunk) const;  // weight stashes (zero-bubble schedules)
  RankUnit::ActivationBytes activation_bytes(int rank) const {
    return ranks_[static_cast<std::size_t>(rank)]->activation_bytes();
  }
  // Floats rank r has summed in TP all-reduces so far (comm volume).
  std::int64_t tp_all_reduced_floats(int rank) const;

 private:
  InProcessTrainer() = default;
  absl::Status connect_ranks();  // RankUnit::connect() of every rank, at once
  void shut_down(caf::actor_system& system, const std::vector<caf::actor>& actors);
  absl::Status finish_traces(absl::Status st) const;

  model::TrainOptions options_;
  ParallelOptions parallel_;
  RunCheckpoints checkpoints_;
  TraceOptions trace_;
  comm::Layout layout_;
  comm::Layout shape_;
  model::data::Datasets data_;
  std::shared_ptr<comm::InProcFabric> fabric_;
  std::vector<std::unique_ptr<RankUnit>> ranks_;
  bool ran_ = false;
};

}  // namespace troupe::actors
