// Coordinator: the step loop of a run, as messages.
//
// Per step: begin_step to every shard, which begins its rank's optimizer
// partitions; collect the loss sum of every micro-batch (from the head chunks) and the squared
// gradient norm of every rank's partitions; answer the partitions with the
// learning rate and the clip scale; when every shard has its new parameters,
// report the step's metrics and begin the next. When nothing is due between
// a step and the next (an evaluation, a checkpoint, an exit), the next
// step's begin_step goes out with the update instead, and each shard takes
// it as it goes ready: no round trip to the coordinator between the steps,
// and a rank that is ready starts while others still update. Metrics are the single-rank
// loop's: loss the token-weighted mean over the global batch, summed in
// global micro-batch order; grad_norm over every parameter once.
//
// A worker that reports a failure or stops ends the run with an error naming
// it; the run ends after the last step otherwise, or earlier, at a step
// boundary, when a host asks (stop_atom; save_now_atom saves there). A
// request is taken at the first boundary whose update has not gone out: a
// step whose update began the next one has that one after it.
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
#include "absl/strings/cord.h"
#include "actors/messages.h"
#include "actors/partition.h"
#include "actors/rank/rank.h"
#include "comm/groups.h"
#include "model/checkpoint.h"
#include "model/trainer.h"

namespace troupe::actors {

// With CoordinatorSetup::mark_rank_reports, the payload (the rank) on the
// outcome of a run that a rank's own failure report ended (failed_atom):
// the report may be second-hand, a peer's death seen as a failed receive
// or copy, so a process host may still blame the loss it hears of a moment
// later (CoordinatorHost, which takes the payload off again).
inline constexpr char kRankReportPayload[] = "troupe/rank-report";

// A rank's report of its failure as a run's outcome (Internal), marked
// with kRankReportPayload.
inline absl::Status rank_report(int rank, const std::string& message) {
  absl::Status st = absl::InternalError(message);
  st.SetPayload(kRankReportPayload, absl::Cord(std::to_string(rank)));
  return st;
}

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
  bool mark_rank_reports = false;               // kRankReportPayload on a rank's report
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
  void finish(absl::Status st);
  void progress() { progress_++; }
  void watch(std::uint64_t seen);
  void poll_workers(std::uint64_t seen);
  void judge_progress(std::uint64_t seen);
  std::string stall_report() const;
  std::string who(int rank) const;

  std::shared_ptr<CoordinatorSetup> setup_;
  model::BatchSchedule batches_;  // each step's global batch
  // One step's (or evaluation batch's) figures and arrivals; a message is
  // checked before it is counted (duplicates are errors).
  struct Tally {
    int step = 0;  // 0: none
    int global_batch = 0;
    float lr = 0;
    float loss_scale = 1;                    // --fp16's
    std::vector<double> loss;                // by global micro-batch
    std::vector<bool> loss_seen, norm_seen;  // by micro-batch, by rank
    std::vector<double> norms;               // by rank
    std::vector<bool> ready;                 // by rank: its shard is ready
    int losses_in = 0, norms_in = 0, ready_in = 0;
    double grad_norm = 0;
    bool skipped = false;
    std::chrono::steady_clock::time_point t0;  // begun
  };
  // The step in progress, which every rank's ready ends; and the next one
  // when it was begun with this one's update (step 0: not begun). Between
  // the two steps nothing else happens (begins_next()), so a step's loss
  // and norms may come before the last ready of the one before it.
  Tally now_, next_;
  std::chrono::steady_clock::time_point last_end_;  // the last step's end (step_s)
  Tally* tally(int step);
  void open(Tally* t, int step, int global_batch);
  bool begins_next(int step) const;
  bool eval_due(int step) const;
  // Why the run is to end after `step` ("" if it is not): an exit signal,
  // --exit-interval, or a host's stop.
  std::string exit_due(int step) const;
  // --fp16's loss scaling.
  std::unique_ptr<model::LossScaler> scaler_;
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
  // A host's requests (stop_atom, save_now_atom), taken at the first step
  // boundary whose update has not gone out (begins_next).
  int stop_after_ = std::numeric_limits<int>::max();
  bool save_now_ = false;
  // The stall watchdog: worker messages so far, and the sum of the workers'
  // own progress counters (WaitReport::progress) at its last question.
  std::uint64_t progress_ = 0;
  std::uint64_t worker_progress_ = 0;
  std::vector<WaitReport> reports_;
  int reports_due_ = 0;
};

}  // namespace troupe::actors
