// The training flags, shared by train, worker and launch.
#include "launcher/train_flags.h"

#include <atomic>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/timed_stage.h"
#include "model/atomic_file.h"

namespace troupe::launcher {

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<std::int64_t>(s + 0.5);
  if (total >= 3600) return absl::StrFormat("%dh%02dm", total / 3600, (total / 60) % 60);
  if (total >= 60) return absl::StrFormat("%dm%02ds", total / 60, total % 60);
  return absl::StrFormat("%.1fs", s);
}

absl::Status check_writable(const std::string& path, const char* flag) {
  absl::StatusOr<model::AtomicFile> probe = model::AtomicFile::create(path);
  if (!probe.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot write there (", probe.status().message(), ")"));
  }
  return absl::OkStatus();
}

void Progress::report(const model::StepMetrics& m) {
  elapsed_ += m.step_s;
  reported_++;  // (a resumed run's first step is not step 1)
  const double eta = elapsed_ / reported_ * (steps_ - m.step);
  const std::string val = m.val_loss ? absl::StrFormat(" | val loss %.4f", *m.val_loss) : "";
  std::printf(
      "step %*d/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | elapsed %s | ETA %s%s\n",
      static_cast<int>(std::to_string(steps_).size()), m.step, steps_, m.loss, m.lr,
      m.grad_norm, m.tokens_per_s, duration(elapsed_).c_str(), duration(eta).c_str(),
      val.c_str());
  std::fflush(stdout);
  // loss, grad_norm and lr with 17 digits: exactly, so that two
  // runs can be compared bit for bit.
  const std::string line = absl::StrFormat(
      "{\"step\": %d, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g, "
      "\"tokens_per_s\": %.9g, \"step_s\": %.9g, \"elapsed_s\": %.9g%s}\n",
      m.step, m.loss, m.grad_norm, m.lr, m.tokens_per_s, m.step_s, elapsed_,
      m.val_loss ? absl::StrFormat(", \"val_loss\": %.17g", *m.val_loss) : "");
  lines_.emplace_back(m.step, line);
  for (std::ofstream* out : metrics_) {
    if (out == nullptr) continue;
    *out << line;
    out->flush();
  }
}

void Progress::rewind(int step, std::vector<std::ofstream*> metrics) {
  while (!lines_.empty() && lines_.back().first > step) lines_.pop_back();
  metrics_ = std::move(metrics);
  for (std::ofstream* out : metrics_) {
    if (out == nullptr) continue;
    for (const auto& [s, line] : lines_) *out << line;
    out->flush();
  }
}

std::string Progress::jsonl() const {
  std::string out;
  for (const auto& [step, line] : lines_) out += line;
  return out;
}

absl::Status write_trace_metrics(const TrainFlags& f, const Progress& progress) {
  if (f.trace.dir.empty()) return absl::OkStatus();
  absl::StatusOr<model::AtomicFile> file = model::AtomicFile::create(f.trace.dir + "/metrics.jsonl");
  if (!file.ok()) return file.status();
  if (absl::Status st = file->write(progress.jsonl()); !st.ok()) return st;
  return file->commit();
}

absl::StatusOr<model::TrainOptions> resolve(const TrainFlags& f) {
  absl::StatusOr<model::GptConfig> config = model::preset(f.model);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--model: ", config.status().message()));
  }
  if (f.layers) config->L = *f.layers;
  if (f.channels) config->C = *f.channels;
  if (f.heads) config->NH = *f.heads;
  if (f.seq_len) config->T = *f.seq_len;
  if (f.vocab_size) config->V = *f.vocab_size;
  if (f.vocab_multiple) config->vocab_multiple = *f.vocab_multiple;
  model::TrainOptions o = f.options;
  o.model = *config;
  if (o.global_batch == 0) o.global_batch = o.micro_batch;
  if (o.lr.decay_iters == 0) o.lr.decay_iters = o.steps;
  if (o.eval_interval > 0 && o.eval_iters == 0) o.eval_iters = 10;  // Megatron's default is 100
  absl::Status st = o.validate();
  if (!st.ok()) return st;
  return o;
}

void add_train_flags(CLI::App* cmd, TrainFlags& f) {
  model::TrainOptions& o = f.options;
  const std::size_t before = cmd->get_options().size();
  cmd->add_option("--model", f.model,
                  "Model preset: tiny, cpu-small, gpt2-124m, gpt2-350m, "
                  "gpt3-1.3b, gpt3-175b, mt-nlg-530b")
      ->capture_default_str();
  cmd->add_option("--layers,--num-layers", f.layers, "Override L (layers)");
  cmd->add_option("--channels,--hidden-size", f.channels, "Override C (channels)");
  cmd->add_option("--heads,--num-attention-heads", f.heads, "Override NH (heads)");
  cmd->add_option("--seq-len,--seq-length", f.seq_len, "Override T (sequence length)");
  cmd->add_option("--vocab-size", f.vocab_size, "Override V (vocabulary size)");
  cmd->add_option("--make-vocab-size-divisible-by", f.vocab_multiple,
                  "Pad the vocabulary to a multiple of this (default 128)");
  cmd->add_option("--micro-batch-size", o.micro_batch, "Sequences per micro-batch (B)")
      ->capture_default_str();
  cmd->add_option("--global-batch-size", o.global_batch,
                  "Sequences per optimizer step (default: the micro-batch size)");
  cmd->add_option("--steps,--train-iters", o.steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--lr", o.lr.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", o.lr.min_lr, "Learning rate at the end of the decay")
      ->capture_default_str();
  cmd->add_option("--lr-warmup-iters", o.lr.warmup_iters, "Linear warm-up steps")
      ->capture_default_str();
  cmd->add_option("--lr-decay-iters", o.lr.decay_iters,
                  "Cosine decay ends here (default: --steps)");
  cmd->add_option("--weight-decay", o.adam.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  cmd->add_option("--adam-beta1", o.adam.beta1, "Adam beta1")->capture_default_str();
  cmd->add_option("--adam-beta2", o.adam.beta2, "Adam beta2")->capture_default_str();
  cmd->add_option("--adam-eps", o.adam.eps, "Adam epsilon")->capture_default_str();
  cmd->add_option("--clip-grad", o.clip_grad, "Clip the global gradient norm to this (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the initialisation and the data order")
      ->capture_default_str();
  cmd->add_option("--data-path", o.data_path,
                  "Megatron indexed dataset PREFIX, or a blend WEIGHT PREFIX WEIGHT PREFIX ...; "
                  "default: a synthetic phrase corpus")
      ->expected(1, -1);
  cmd->add_option("--split", o.split, "Train,valid,test shares of the documents")
      ->capture_default_str();
  cmd->add_option("--data-cache-path", o.data_cache_path,
                  "Where sample indices are cached (default: DATA_DIR/cache)");
  cmd->add_option("--eval-interval", o.eval_interval, "Validation loss every N steps");
  cmd->add_option("--eval-iters", o.eval_iters, "Global batches per validation");
  cmd->add_flag(
      "--no-shuffle", [&o](std::int64_t) { o.shuffle = false; },
      "Samples in file order: sample i is tokens [i*T, i*T+T+1)");
  cmd->add_option("--init-weights", o.init_weights, "Start from these safetensors weights");
  cmd->add_option("--save-weights", f.save_weights,
                  "Write the final weights here (safetensors)");
  actors::CheckpointOptions& ck = f.checkpoint;
  cmd->add_option("--save", ck.save,
                  "Checkpoint directory: DIR/iter_NNNNNNN/ after every --save-interval steps and "
                  "the last");
  cmd->add_option("--save-interval", ck.save_interval,
                  "Steps between checkpoints (default: only after the last step)");
  cmd->add_option("--keep-last", ck.keep_last,
                  "Keep only the newest K checkpoints in --save (default: all)");
  cmd->add_option("--load", ck.load,
                  "Resume from the newest checkpoint in DIR, or from DIR/iter_NNNNNNN (any "
                  "--tp/--pp/--dp/--schedule)");
  cmd->add_flag(
      "--no-load-optim,--finetune", [&ck](std::int64_t) { ck.load_optim = false; },
      "With --load: the parameters only; a new run from step 1 with fresh optimizer state");
  cmd->add_flag(
      "--exit-signal-handler", [&ck](std::int64_t) { ck.exit_signal_handler = true; },
      "On SIGTERM, save a checkpoint after the current step and exit cleanly");
  cmd->add_option("--exit-interval", ck.exit_interval,
                  "End the run (saving, with --save) after a step that is a multiple of this");
  cmd->add_option("--metrics-jsonl", f.metrics_jsonl, "Write one JSON object per step here");
  cmd->add_option("--threads", o.threads, "Compute threads (default: all cores)");
  actors::ParallelOptions& par = f.parallel;
  cmd->add_option("--tp,--tensor-model-parallel-size", par.tp,
                  "Tensor-parallel ranks per stage (Megatron slicing)")
      ->capture_default_str();
  cmd->add_option("--pp,--pipeline-model-parallel-size", par.pp, "Pipeline stages")
      ->capture_default_str();
  cmd->add_option("--dp,--data-parallel-size", par.dp, "Data-parallel replicas (ZeRO-1)")
      ->capture_default_str();
  cmd->add_option("--schedule", f.schedule, "Pipeline schedule: gpipe, 1f1b, interleaved")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", par.virtual_stages,
                  "Model chunks per stage (interleaved schedule)")
      ->capture_default_str();
  cmd->add_option("--stall-timeout", par.stall_timeout_s,
                  "Seconds without progress after which the run is hung: it stops and says what "
                  "every rank waits for (0: never)")
      ->capture_default_str();
  cmd->add_option("--debug-fail-stage", f.fail_at,
                  "Testing: the shard of stage S throws at step K (S:K)")
      ->group("");
  cmd->add_option("--debug-stall-stage", f.stall_at,
                  "Testing: the shard of stage S never starts step K (S:K)")
      ->group("");
  actors::TraceOptions& tr = f.trace;
  cmd->add_option("--trace", tr.dir,
                  "Record every op, message and wait of every rank and write them here at the end "
                  "(also on failure and on SIGUSR1); read with `troupe trace DIR`");
  cmd->add_option("--trace-steps", f.trace_steps,
                  "Record only steps A..B (A:B, as Megatron's --profile-step-start/end)");
  cmd->add_option("--trace-buffer", f.trace_buffer,
                  "Events each rank keeps (the newest; default 262144 with --trace, 4096 without)");
  cmd->add_option("--flight-dir", tr.flight_dir,
                  "Where a failed or stalled run writes its flight recorder (default "
                  "./troupe-flight-<date>-<pid>; `troupe launch`: the run directory's flight/)");
  cmd->add_flag("--debug-trace-off", tr.off,
                "Benchmarks: record nothing, not even the flight recorder")
      ->group("");
  cmd->add_option("--debug-op-cost", f.op_cost,
                  "Testing: every forward and backward of a chunk only sleeps FWD_MS:BWD_MS")
      ->group("");
  const std::vector<CLI::Option*> all = cmd->get_options();
  f.registered.assign(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
}

namespace {

std::atomic<bool> exit_signal{false};

void on_exit_signal(int) { exit_signal.store(true); }

}  // namespace

void install_exit_signal_handler() {
  struct sigaction sa = {};
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

bool exit_signal_received() { return exit_signal.load(); }

absl::StatusOr<std::optional<model::ckpt::Checkpoint>> open_load(const TrainFlags& f,
                                                                 const model::TrainOptions& o) {
  const actors::CheckpointOptions& ck = f.checkpoint;
  if (ck.load.empty()) return std::nullopt;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!ck.save.empty() && fs::equivalent(ck.load, ck.save, ec) &&
      !fs::exists(fs::path(ck.load) / model::ckpt::kTracker, ec) &&
      !fs::exists(fs::path(ck.load) / "manifest.json", ec)) {
    return std::nullopt;  // a job's first start: nothing saved yet
  }
  absl::StatusOr<model::ckpt::Checkpoint> c = model::ckpt::Checkpoint::open(ck.load);
  absl::Status st = c.status();
  if (st.ok()) st = c->check_model(o.model);
  if (st.ok() && ck.load_optim) st = c->check_resume(o);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat("--load: ", st.message()));
  return std::optional<model::ckpt::Checkpoint>(*std::move(c));
}

std::string describe_load(const TrainFlags& f, const model::ckpt::Checkpoint& c) {
  const model::ckpt::Meta& m = c.meta();
  return absl::StrCat(f.checkpoint.load_optim ? "resuming from " : "parameters from ", c.dir(),
                      " (step ", m.step, ", written with ", m.describe_layout(), " by ", m.writer,
                      ")");
}

namespace {

// --trace-steps, --debug-op-cost; --trace and --flight-dir made absolute (a
// worker may run elsewhere).
absl::Status finish_trace_flags(TrainFlags& f) {
  actors::TraceOptions& tr = f.trace;
  if (!f.trace_steps.empty()) {
    int a = 0, b = 0;
    char end = 0;
    if (std::sscanf(f.trace_steps.c_str(), "%d:%d%c", &a, &b, &end) != 2 || a < 1 || b < a) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--trace-steps ", f.trace_steps, ": expected A:B with 1 <= A <= B (steps A to B)"));
    }
    if (tr.dir.empty()) return absl::InvalidArgumentError("--trace-steps needs --trace DIR");
    tr.first_step = a;
    tr.last_step = b;
  }
  // (64 bytes an event: 2^24 is 1 GiB a rank.)
  if (f.trace_buffer < 0 || f.trace_buffer > (std::int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trace-buffer ", f.trace_buffer, ": expected 1 to 16777216 events a rank (1 GiB)"));
  }
  tr.events = static_cast<std::size_t>(f.trace_buffer);
  if (!f.op_cost.empty()) {
    char end = 0;
    if (std::sscanf(f.op_cost.c_str(), "%lf:%lf%c", &f.fwd_ms, &f.bwd_ms, &end) != 2 ||
        !(f.fwd_ms >= 0) || !(f.bwd_ms >= 0) || f.fwd_ms > 1e5 || f.bwd_ms > 1e5) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--debug-op-cost ", f.op_cost, ": expected FWD_MS:BWD_MS (milliseconds, >= 0)"));
    }
  }
  for (std::string* dir : {&tr.dir, &tr.flight_dir}) {
    if (dir->empty()) continue;
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(*dir, ec);
    if (!ec) *dir = abs.lexically_normal().string();
  }
  if (!tr.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(tr.dir, ec);
    if (ec || !std::filesystem::is_directory(tr.dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--trace ", tr.dir, ": cannot make the directory",
          ec ? absl::StrCat(" (", ec.message(), ")") : std::string(" (a file is in the way)")));
    }
    if (absl::Status st = check_writable(tr.dir + "/.probe", "--trace"); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status finish_train_flags(TrainFlags& f) {
  actors::CheckpointOptions& ck = f.checkpoint;
  if (ck.save_interval < 0) {
    return absl::InvalidArgumentError("--save-interval must not be negative");
  }
  if (ck.exit_interval < 0) {
    return absl::InvalidArgumentError("--exit-interval must not be negative");
  }
  if (ck.keep_last < 0) return absl::InvalidArgumentError("--keep-last must not be negative");
  if (ck.save.empty() && (ck.save_interval > 0 || ck.keep_last > 0 || ck.exit_signal_handler)) {
    return absl::InvalidArgumentError(
        "--save-interval, --keep-last and --exit-signal-handler need --save DIR");
  }
  if (!ck.load_optim && ck.load.empty()) {
    return absl::InvalidArgumentError("--no-load-optim needs --load DIR");
  }
  if (!ck.save.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(ck.save, ec);
    if (ec || !std::filesystem::is_directory(ck.save)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--save ", ck.save, ": cannot make the directory",
          ec ? absl::StrCat(" (", ec.message(), ")") : std::string(" (a file is in the way)")));
    }
    if (absl::Status st = check_writable(ck.save + "/.probe", "--save"); !st.ok()) return st;
  }
  absl::StatusOr<actors::ScheduleKind> kind = actors::parse_schedule(f.schedule);
  if (!kind.ok()) return kind.status();
  f.parallel.schedule = *kind;
  if (!f.fail_at.empty() &&
      std::sscanf(f.fail_at.c_str(), "%d:%d", &f.parallel.fail.stage,
                  &f.parallel.fail.step) != 2) {
    return absl::InvalidArgumentError("--debug-fail-stage " + f.fail_at + ": expected STAGE:STEP");
  }
  if (!f.stall_at.empty()) {
    f.parallel.fail.kind = actors::FailPoint::Kind::kStall;
    if (std::sscanf(f.stall_at.c_str(), "%d:%d", &f.parallel.fail.stage,
                    &f.parallel.fail.step) != 2) {
      return absl::InvalidArgumentError("--debug-stall-stage " + f.stall_at + ": expected STAGE:STEP");
    }
  }
  return finish_trace_flags(f);
}

actors::StageFactory stage_factory(const TrainFlags& f) {
  if (f.op_cost.empty()) return nullptr;
  return actors::timed_stage_factory(f.fwd_ms, f.bwd_ms);
}

std::vector<std::string> forwarded_train_flags(const TrainFlags& f,
                                               const std::vector<std::string>& skip) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : f.registered) {
    if (opt->count() == 0) continue;
    if (opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames().front();
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    out.push_back(name);
    // A flag (--no-shuffle) takes no value: CLI11 records it as "true".
    if (opt->get_type_size_max() == 0 || opt->get_expected_max() == 0) continue;
    for (const std::string& v : opt->results()) out.push_back(v);
  }
  return out;
}

}  // namespace troupe::launcher
