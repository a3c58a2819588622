// The flags of `troupe train`, shared by `troupe worker` and `troupe
// launch` (which forwards them to its workers), and what turns them into
// training options; the progress line and metrics JSONL of a run.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/rank.h"
#include "model/checkpoint.h"
#include "model/trainer.h"

namespace troupe::launcher {

struct TrainFlags {
  std::string model = "tiny";
  std::optional<int> layers, channels, heads, seq_len, vocab_size, vocab_multiple;
  model::TrainOptions options;
  std::string save_weights;
  std::string metrics_jsonl;
  actors::ParallelOptions parallel;
  actors::CheckpointOptions checkpoint;
  std::string schedule = "1f1b";
  std::string fail_at;   // --debug-fail-stage S:K
  std::string stall_at;  // --debug-stall-stage S:K
  actors::TraceOptions trace;  // --trace, --trace-steps, --trace-buffer, --flight-dir
  std::string trace_steps;     // --trace-steps A:B
  std::int64_t trace_buffer = 0;  // --trace-buffer N (0: the default)
  std::string op_cost;         // --debug-op-cost FWD_MS:BWD_MS
  double fwd_ms = -1, bwd_ms = -1;
  // Every option add_train_flags registered, in order (to forward them).
  std::vector<CLI::Option*> registered;
};

// Registers the training flags on `cmd`; `f` must outlive the parse.
void add_train_flags(CLI::App* cmd, TrainFlags& f);
// After the parse: the schedule and the debug fail points, checked.
absl::Status finish_train_flags(TrainFlags& f);
// The model chunks the flags ask for: fixed-cost ones with --debug-op-cost,
// else nullptr (GPT chunks).
actors::StageFactory stage_factory(const TrainFlags& f);
// The flags as given, to pass on to a worker (those named in `skip` left out).
std::vector<std::string> forwarded_train_flags(const TrainFlags& f,
                                               const std::vector<std::string>& skip);
// The options the flags describe (defaults filled in, validated).
absl::StatusOr<model::TrainOptions> resolve(const TrainFlags& f);
// --load's checkpoint, opened and checked against the run (its model; for a
// resume its data too); nullopt without --load, or when --load names the
// --save directory and it has no checkpoint yet (the first start of a job
// that restarts itself). Errors name the flag and the file.
absl::StatusOr<std::optional<model::ckpt::Checkpoint>> open_load(const TrainFlags& f,
                                                                 const model::TrainOptions& o);
// The --load line of a run's banner ("resuming from DIR (step 40, tp=2 ...)").
std::string describe_load(const TrainFlags& f, const model::ckpt::Checkpoint& c);
// SIGTERM sets a flag (--exit-signal-handler): the run saves and ends.
void install_exit_signal_handler();
bool exit_signal_received();

// Fails early (before any training) if `path` cannot be written: makes the
// temporary the save will make, and removes it.
absl::Status check_writable(const std::string& path, const char* flag);
std::string duration(double s);

// The progress line and the metrics JSONL, one of each per step.
class Progress {
 public:
  // Each step's JSON goes to every stream of `metrics` that is not null.
  Progress(int steps, std::vector<std::ofstream*> metrics)
      : steps_(steps), metrics_(std::move(metrics)) {}
  Progress(int steps, std::ofstream* metrics) : Progress(steps, std::vector<std::ofstream*>{metrics}) {}
  void report(const model::StepMetrics& m);
  // A restart resumes after `step`: the lines of later steps are dropped
  // (they are run again), and `metrics` (reopened, empty) get those kept.
  void rewind(int step, std::vector<std::ofstream*> metrics);
  // Every step's JSON line so far (what the metrics JSONL holds), in order.
  std::string jsonl() const;

 private:
  int steps_;
  std::vector<std::ofstream*> metrics_;
  double elapsed_ = 0.0;
  int reported_ = 0;
  std::vector<std::pair<int, std::string>> lines_;  // (step, its JSON line)
};

// --trace DIR's copy of the metrics: DIR/metrics.jsonl, written atomically
// (nothing without --trace).
absl::Status write_trace_metrics(const TrainFlags& f, const Progress& progress);

}  // namespace troupe::launcher
