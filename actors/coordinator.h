// Coordinator: the step loop of a run, as messages.
//
// Per step: begin_step to every shard, which begins its rank's optimizer
// partitions; collect the loss sum of every micro-batch (from the head chunks) and the squared
// gradient norm of every rank's partitions; answer the partitions with the
// learning rate and the clip scale; when every shard has its new parameters,
// report the step's metrics and begin the next. Metrics are the single-rank
// loop's: loss the token-weighted mean over the global batch, summed in
// global micro-batch order; grad_norm over every parameter once.
//
// A worker that reports a failure or stops ends the run with an error naming
// it; the run ends after the last step otherwise, or earlier, at a step
// boundary, when a host asks (stop_atom; save_now_atom saves there).
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "actors/messages.h"
#include "actors/partition.h"
#include "actors/rank/rank.h"
#include "comm/groups.h"
#include "model/checkpoint.h"
#include "model/trainer.h"

namespace troupe::actors {

struct CoordinatorSetup {
  model::TrainOptions options;
  comm::Layout layout;
  comm::Layout shape;
  int m = 1;                           // micro-batches per replica at the full global batch
  bool has_valid = false;              // validation data for --eval-interval
  std::vector<caf::actor> shards;      // by rank
  std::vector<caf::actor> optimizers;  // by rank
  std::function<void(const model::StepMetrics&)> on_step;
  std::function<void(absl::Status)> on_finish;  // once, when the run ends
  // Every this long the coordinator asks every worker what it waits for and
  // how much work it has done; with no worker message and no work done in
  // that time the run is hung, and it ends with their answers. 0: never.
  double stall_timeout_s = 0;
  // By rank, the host each rank runs on, for the stall report; empty:
  // unknown (one process: every rank is here).
  std::vector<std::string> hosts;

  // A resumed run: the checkpoint's step and evaluations (the run trains
  // steps first_step .. options.steps).
  int first_step = 1;
  int evaluations_done = 0;
  std::optional<model::LossScaleState> loss_scale;  // --fp16's scaler and the skipped steps
  // --save: checkpoints into save_dir after every save_interval steps and
  // the last (model/checkpoint.h). The coordinator makes the temporary,
  // every optimizer copies its rank's state and writes it behind, and the
  // coordinator commits when all have written. `meta` has the layout and
  // options; the coordinator fills in the step.
  std::string save_dir;
  int save_interval = 0;
  int keep_last = 0;
  model::ckpt::Meta meta;
  // --exit-signal-handler: true once SIGTERM arrived; the run saves after
  // the step it is in and ends (OK).
  std::function<bool()> exit_requested;
  int exit_interval = 0;  // --exit-interval: end after a step that is a multiple (0: never)
  std::function<void(const std::string&)> log;  // a line for the user
  // Once a checkpoint is committed: its step and directory (DIR/iter_N).
  std::function<void(int step, const std::string& dir)> on_checkpoint;
};

// Fills in setup's resume and save fields from `c` (--load's step, --save's
// directory, the manifest's layout and options).
void set_checkpoints(CoordinatorSetup* setup, const RunCheckpoints& c,
                     const ParallelOptions& parallel);

class Coordinator : public caf::event_based_actor {
 public:
  // The workers are filled in before start_atom arrives.
  Coordinator(caf::actor_config& cfg, std::shared_ptr<CoordinatorSetup> setup);
  caf::behavior make_behavior() override;
  // However the coordinator ends, the run is told (and the handles to the
  // workers, which hold the coordinator's, are let go).
  void on_exit() override;

 private:
  void begin(int step);
  void on_loss(int step, int d, int j, double sum);
  void on_norm(int step, int rank, double sq);
  void on_ready(int step, int rank);
  void begin_eval_batch();
  void step_done();
  void request_save(int step);
  void start_save(int step);
  void on_snapshot(int step, int rank, const std::string& error);
  void on_saved(int step, int rank, const std::string& records, const std::string& error);
  bool commit_save();
  void say(const std::string& line) const {
    if (setup_->log) setup_->log(line);
  }
  void reset_tallies();
  void finish(absl::Status st);
  void progress() { progress_++; }
  void watch(std::uint64_t seen);
  void poll_workers(std::uint64_t seen);
  void judge_progress(std::uint64_t seen);
  std::string stall_report() const;
  std::string who(int rank) const;

  std::shared_ptr<CoordinatorSetup> setup_;
  model::BatchSchedule batches_;  // each step's global batch
  int global_batch_ = 0;          // this step's (or the evaluation's)
  int step_ = 0;
  float lr_ = 0;
  std::vector<double> loss_;                 // by global micro-batch
  std::vector<bool> loss_seen_, norm_seen_;  // this step's arrivals (duplicates are errors)
  std::vector<double> norms_;                // by rank
  int losses_in_ = 0, norms_in_ = 0, ready_in_ = 0;
  std::vector<bool> ready_;  // by rank: its shard is ready (the stall report's "done")
  double grad_norm_ = 0;
  // --fp16's loss scaling, and this step's outcome.
  std::unique_ptr<model::LossScaler> scaler_;
  float loss_scale_ = 1;  // this step's
  bool skipped_ = false;
  // Evaluation after a step (--eval-interval): batch k of --eval-iters.
  bool evaluating_ = false;
  int eval_batch_ = 0, evaluations_done_ = 0;
  double val_total_ = 0;
  model::StepMetrics metrics_;
  bool finished_ = false;
  // Checkpoints: the save being written (0: none), one waiting for it, and
  // the end of the run once the last save is committed.
  struct Save {
    int step = 0;
    int evaluations_done = 0;  // at the step boundary it was taken at
    model::LossScaleState loss_scale;
    std::string tmp;
    int snapshots = 0, written = 0;
    std::vector<std::vector<model::ckpt::TensorRecord>> records;  // by rank
    std::vector<bool> snapshotted, wrote;                         // by rank
    std::chrono::steady_clock::time_point t0;
    double stall_s = 0;
  };
  Save save_;
  int pending_save_ = 0;
  bool ending_ = false, exiting_ = false;
  // A host's requests (stop_atom, save_now_atom), taken at the next step boundary.
  int stop_after_ = std::numeric_limits<int>::max();
  bool save_now_ = false;
  // The stall watchdog: worker messages so far, and the sum of the workers'
  // own progress counters (WaitReport::progress) at its last question.
  std::uint64_t progress_ = 0;
  std::uint64_t worker_progress_ = 0;
  std::vector<WaitReport> reports_;
  int reports_due_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace troupe::actors
