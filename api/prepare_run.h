// One place that turns `troupe train`'s flags into a run. troupe train,
// troupe launch, troupe worker and the embedding API (JobConfig::from_flags)
// each call prepare_run, saying who runs the ranks, and get the same checks
// in the same order with the same messages:
//   1. the flags themselves (finish_train_flags): the schedule, the fail
//      points, --trace, the checkpoint flags;
//   2. the device: --device's default where this process knows its host
//      (train, worker, embedded; launch after placing its workers), then
//      --device against the layout;
//   3. --print-config refused by a worker (an embedded job refuses it at
//      the parse, JobConfig::from_flags);
//   4. the options (resolve): the model, --recipe, recompute, precision,
//      the batch, the run's length, validated;
//   5. --print-config: printed (train, launch), and the run ends there;
//   6. the layout against the model and the batch, naming a recipe's values;
//   7. --save-weights writable, checked by the process that starts the run
//      (train, which writes it; launch, whose rank 0 worker writes it; a
//      worker an engine starts does not check it early);
//   8. --load opened and checked where a start reads it once (train, worker;
//      launch opens the newest at each start, an embedded job at its own);
//   9. --save locked from the start by the process that commits every
//      checkpoint of the job (train; launch, over its restarts). (An
//      embedded job locks it when it starts; under srun or mpirun, rank 0's
//      worker commits and takes the lock at its first save, begin_save.)
#pragma once

#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "api/train_flags.h"
#include "model/checkpoint.h"
#include "model/trainer.h"

namespace troupe::api {

// Who runs the ranks.
enum class Runner {
  kTrain,     // troupe train: every rank in this process
  kLaunch,    // troupe launch: a worker per rank; this process coordinates
  kWorker,    // troupe worker: one rank of a job
  kEmbedded,  // JobConfig::from_flags: every rank in the host program
};

struct RunRequest {
  Runner runner = Runner::kTrain;
  int workers_here = 1;  // the job's processes on this host (--device's default)
};

struct PreparedRun {
  model::TrainOptions options;
  std::set<std::string> recipe_set;  // the flags --recipe set
  std::string device_why;            // why --device's default is what it is; "" when given
  bool printed = false;              // --print-config: printed; run nothing
  std::optional<model::ckpt::Checkpoint> load;  // --load's, opened (train, worker)
};

// The steps above, in that order; the first error ends them.
absl::StatusOr<PreparedRun> prepare_run(TrainFlags& f, const RunRequest& request);

// Step 4 alone: the options the flags describe (--recipe applied where no
// flag says otherwise, defaults filled in, validated); `recipe_set` gets the
// flags the recipe set.
absl::StatusOr<model::TrainOptions> resolve(const TrainFlags& f,
                                            std::set<std::string>* recipe_set = nullptr);

}  // namespace troupe::api
