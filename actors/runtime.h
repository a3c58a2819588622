// Training with every rank as actors in one process: the in-process
// transport carries activations, gradients and parameters between them;
// one CAF actor system hosts a ShardActor and an OptimizerActor per rank
// and the Coordinator. This is what `troupe train --pp P --dp D` runs.
//
// The buffers, streams and transports of each rank belong to this object
// and outlive the actors, so a run ends in a fixed order: the coordinator
// finishes, the transports fail what is pending, the actors exit, the
// streams drain.
//
//   auto t = actors::InProcessTrainer::create(options, {.pp = 2, .dp = 2});
//   RETURN_IF_ERROR((*t)->run([](const model::StepMetrics& m) { ... }));
//   RETURN_IF_ERROR((*t)->gather_params(whole_gpt));     // e.g. to save it
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "absl/status/statusor.h"
#include "actors/optimizer_actor.h"
#include "actors/partition.h"
#include "actors/schedule.h"
#include "actors/shard_actor.h"
#include "actors/stage_compute.h"
#include "comm/groups.h"
#include "comm/communicator.h"
#include "comm/inproc_transport.h"
#include "model/data/datasets.h"
#include "model/trainer.h"

namespace troupe::actors {

struct ParallelOptions {
  int tp = 1;              // --tp: tensor-parallel ranks per stage (Megatron slicing)
  int pp = 1;              // --pp: pipeline stages
  int dp = 1;              // --dp: data-parallel replicas
  int virtual_stages = 1;  // --virtual-stages: model chunks per stage (interleaved)
  ScheduleKind schedule = ScheduleKind::k1F1B;
  FailPoint fail = {};  // testing (--debug-fail-stage, --debug-stall-stage)
  double stall_timeout_s = 600;  // --stall-timeout: a run with no progress this long fails

  // Micro-batches per replica and step.
  int m(const model::TrainOptions& o) const { return o.global_batch / (o.micro_batch * dp); }
  int world() const { return tp * pp * dp; }
  // The model as the ranks hold it: the vocabulary padded to a multiple of
  // --make-vocab-size-divisible-by x tp (as Megatron), so it slices evenly.
  model::GptConfig sliced_config(const model::GptConfig& c) const;
  // InvalidArgument naming the flag when the layout does not fit the model
  // or the batch.
  absl::Status validate(const model::TrainOptions& o) const;
};

class InProcessTrainer {
 public:
  // Makes a model chunk; the default makes a GptStage. (The pipeline
  // benchmark swaps in chunks whose ops take a fixed time.)
  using StageFactory = std::function<std::unique_ptr<GptStage>(
      const model::GptConfig& config, int B, const model::StageSpec& spec, int slots)>;

  static absl::StatusOr<std::unique_ptr<InProcessTrainer>> create(
      const model::TrainOptions& options, const ParallelOptions& parallel,
      const StageFactory& factory = nullptr);
  ~InProcessTrainer();

  using StepCallback = std::function<void(const model::StepMetrics&)>;
  // Runs options.steps steps (once per object) in its own actor system, or
  // in `system` (whose config must have had add_message_types()).
  absl::Status run(const StepCallback& on_step);
  absl::Status run(caf::actor_system& system, const StepCallback& on_step);

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
  // Every byte the optimizer side of rank r allocated (state, the sum of the
  // replicas, the staging window, norms), as the device counted it.
  std::int64_t optimizer_bytes(int rank) const;
  int slots(int rank, int chunk) const;
  // Floats rank r has summed in TP all-reduces so far (comm volume).
  std::int64_t tp_all_reduced_floats(int rank) const;

 private:
  InProcessTrainer() = default;
  struct Rank {
    int rank = 0;
    comm::Coord coord;
    std::vector<std::unique_ptr<GptStage>> chunks;       // by chunk
    std::vector<std::unique_ptr<Partition>> partitions;  // by chunk
    std::int64_t optimizer_bytes = 0;                    // what making them allocated
    std::unique_ptr<comm::Transport> transport;
    std::unique_ptr<comm::Communicator> tensor;  // the TP group's collectives (tp > 1)
    std::shared_ptr<std::atomic<std::int64_t>> tp_floats =
        std::make_shared<std::atomic<std::int64_t>>(0);
    // Last, so that they drain before the buffers above go away.
    std::unique_ptr<gpu::Stream> stream, optimizer_stream;
  };
  absl::Status init_params(Rank& r);
  void shut_down(caf::actor_system& system, const std::vector<caf::actor>& actors);

  model::TrainOptions options_;
  ParallelOptions parallel_;
  comm::Layout layout_;
  PipelineShape shape_;
  model::data::Datasets data_;
  std::shared_ptr<comm::InProcFabric> fabric_;
  std::vector<Rank> ranks_;
  std::vector<GradPiece> grad_pieces_;
  std::vector<ParamPiece> param_pieces_;
  bool ran_ = false;
};

}  // namespace troupe::actors
