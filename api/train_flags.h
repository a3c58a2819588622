// The flags of `troupe train`, shared by `troupe worker` and `troupe
// launch` (which forwards them to its workers) and by the embedding API
// (troupe/troupe.h: JobConfig::from_flags), and what turns them into
// training options; the progress line and metrics JSONL of a run. The one
// flag table, above actors/: the libraries below it define no flags.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/rank/rank.h"
#include "actors/rank/timed_stage.h"
#include "model/checkpoint.h"
#include "model/trainer.h"

namespace troupe::api {

struct TrainFlags {
  std::string model = "tiny";
  std::optional<int> layers, channels, heads, seq_len, vocab_size, vocab_multiple;
  std::optional<double> init_std;  // --init-method-std
  std::string recipe;              // --recipe mt-nlg
  bool print_config = false;       // --print-config: print the resolved run, train nothing
  model::TrainOptions options;
  // --recompute-granularity, --recompute-method, --recompute-num-layers,
  // --recompute-activations (Megatron's shorthand for selective).
  std::string recompute_granularity, recompute_method;
  std::string attention_kernel;  // --attention-kernel; empty: default_attention_kernel's
  std::optional<int> recompute_layers;
  bool recompute_activations = false;
  bool bf16 = false, fp16 = false;  // --bf16, --fp16
  // The loss-scaling flags, to say they need --fp16.
  std::vector<CLI::Option*> loss_scale_flags;
  std::string save_weights;
  std::string metrics_jsonl;
  int log_interval = 0;              // --log-interval; 0: default_log_interval(steps)
  std::vector<std::int64_t> rampup;  // --rampup-batch-size START INCREMENT SAMPLES
  // Options whose presence matters (--steps against --train-samples).
  CLI::Option *steps_flag = nullptr, *warmup_iters_flag = nullptr, *decay_iters_flag = nullptr;
  actors::ParallelOptions parallel;
  actors::CheckpointOptions checkpoint;
  std::string schedule = "1f1b";
  std::string fail_at;            // --debug-fail-stage S:K
  std::string stall_at;           // --debug-stall-stage S:K
  actors::TraceOptions trace;     // --trace, --trace-steps, --trace-buffer, --flight-dir
  std::string trace_steps;        // --trace-steps A:B
  std::int64_t trace_buffer = 0;  // --trace-buffer N (0: the default)
  std::string device;             // --device cpu|cuda|opaque; empty: resolve_device's
  std::string op_cost;            // --debug-op-cost F:B:W or FWD:BWD (a list: one per stage)
  double op_jitter = 0;           // --debug-op-jitter X
  actors::OpCosts op_costs;       // both, parsed
  // Every option add_train_flags registered, in order (to forward them).
  std::vector<CLI::Option*> registered;
};

// The device a run computes on (--device), and its owner.
struct RunDevice {
  gpu::Device* device = nullptr;
  std::unique_ptr<gpu::Device> owned;  // a GPU's; the CPU device is the process's
};
// Where a run computes when --device (or TROUPE_DEVICE) does not say: cuda
// where this host has a GPU for each of its workers and the flags can use
// it, else cpu. `gpus`: the GPUs this process sees; `workers`: the job's processes on
// this host (1 for troupe train; with more workers than GPUs, cpu: a worker
// that was given its own GPU by CUDA_VISIBLE_DEVICES cannot be told from
// workers that would share one); `unsupported_gpu`: "" or why a visible GPU
// cannot run troupe's kernels (gpu::cuda_unsupported_device). In one
// process the ranks share its GPU. `why` is for the banner.
struct DefaultDevice {
  std::string device;  // "cuda" or "cpu"
  std::string why;
};
DefaultDevice default_device(const TrainFlags& f, bool process_per_rank, int gpus, int workers,
                             const std::string& unsupported_gpu);
// Sets an empty f.device to default_device's for this process (its GPUs as
// CUDA sees them; none in a build without CUDA). Returns the why where a
// GPU is visible, else "" (and where the flag was given).
std::string resolve_device(TrainFlags& f, bool process_per_rank, int workers = 1);
// --device (cpu, cuda, opaque; empty: cpu) as the other flags allow it:
// cuda runs every layout with a process per rank (`process_per_rank`: troupe
// launch and its workers), its TP groups through NCCL; in one process (troupe
// train, an embedded job) it runs one rank, or pipeline and data
// parallelism, but not --tp > 1 (every rank there shares the one GPU, and
// NCCL takes a GPU per member). Neither cuda nor opaque
// (gpu::make_opaque_cpu_device, for tests) takes --debug-op-cost (CPU
// chunks). InvalidArgument naming the flags.
absl::Status check_device(const TrainFlags& f, bool process_per_rank = false);
// check_device, then the device itself: a GPU is `local_rank`'s (a worker's
// place on its node, as its launcher or engine says), else LOCAL_RANK's,
// else the first; the only one where the process sees one. Unavailable
// naming the flag where there is none.
absl::StatusOr<RunDevice> open_device(const TrainFlags& f, int local_rank = -1,
                                      bool process_per_rank = false);

// Registers the training flags on `cmd`; `f` must outlive the parse.
void add_train_flags(CLI::App* cmd, TrainFlags& f);
// After the parse: the schedule and the debug fail points, checked.
absl::Status finish_train_flags(TrainFlags& f);
// The checkpoint flags alone (--save made and writable, intervals, what
// needs --save or --load), as finish_train_flags checks them.
absl::Status check_checkpoint_flags(const actors::CheckpointOptions& ck);
// The model chunks the flags ask for: fixed-cost ones with --debug-op-cost,
// else nullptr (GPT chunks).
actors::StageFactory stage_factory(const TrainFlags& f);
// The flags as given, to pass on to a worker (those named in `skip` left out).
std::vector<std::string> forwarded_train_flags(const TrainFlags& f,
                                               const std::vector<std::string>& skip);
// --load's checkpoint, opened and checked against the run (its model; for a
// resume its data too); nullopt without --load, or when --load names the
// --save directory and it has no checkpoint yet (the first start of a job
// that restarts itself). Errors name the flag and the file.
absl::StatusOr<std::optional<model::ckpt::Checkpoint>> open_load(const TrainFlags& f,
                                                                 const model::TrainOptions& o);
absl::StatusOr<std::optional<model::ckpt::Checkpoint>> open_load(
    const actors::CheckpointOptions& ck, const model::TrainOptions& o);
// The --load line of a run's banner ("resuming from DIR (step 40, tp=2 ...)").
std::string describe_load(const TrainFlags& f, const model::ckpt::Checkpoint& c);
// SIGTERM sets a flag (--exit-signal-handler): the run saves and ends.
void install_exit_signal_handler();
bool exit_signal_received();

// Fails early (before any training) if `path` cannot be written: makes the
// temporary the save will make, and removes it.
absl::Status check_writable(const std::string& path, const char* flag);
std::string duration(double s);

// --log-interval's default: every step up to 100 steps, then about 100
// lines a run (the run's length alone decides, never its timing).
int default_log_interval(int steps);

// The progress line, every `log_interval` steps and after the last one,
// averaged over the steps since the line before (loss, tokens/s, time a
// step; lr and grad norm are the step's own); a step with a validation loss
// says it too. On a terminal the current step refreshes in place between
// lines. The metrics JSONL gets every step.
class Progress {
 public:
  // Each step's JSON goes to every stream of `metrics` that is not null;
  // log_interval 0 is default_log_interval(steps).
  Progress(int steps, std::vector<std::ofstream*> metrics, int log_interval = 0);
  Progress(int steps, std::ofstream* metrics, int log_interval = 0)
      : Progress(steps, std::vector<std::ofstream*>{metrics}, log_interval) {}
  int log_interval() const { return interval_; }
  void report(const model::StepMetrics& m);
  // A run that ends early (--exit-interval, a signal, a failure): the line
  // of the steps since the last one, if any.
  void finish();
  // A restart resumes after `step`: the lines of later steps are dropped
  // (they are run again), and `metrics` (reopened, empty) get those kept.
  void rewind(int step, std::vector<std::ofstream*> metrics);
  // Every step's JSON line so far (what the metrics JSONL holds), in order.
  std::string jsonl() const;

 private:
  // The line's text (no newline), over the given averages.
  void print(const model::StepMetrics& m, double loss, double tokens_per_s, double step_s);

  int steps_;
  std::vector<std::ofstream*> metrics_;
  int interval_;
  bool terminal_;      // stdout is a terminal: the live line
  bool live_ = false;  // a live line is showing (no newline yet)
  double elapsed_ = 0.0;
  int reported_ = 0;
  // Since the last line: steps, their loss sum, seconds and tokens.
  int window_ = 0;
  double window_loss_ = 0.0, window_s_ = 0.0, window_tokens_ = 0.0;
  model::StepMetrics last_;  // the window's last step
  void end_window();
  std::vector<std::pair<int, std::string>> lines_;  // (step, its JSON line)
};

// --trace DIR's copy of the metrics: DIR/metrics.jsonl, written atomically
// (nothing without --trace).
absl::Status write_trace_metrics(const TrainFlags& f, const Progress& progress);

}  // namespace troupe::api
