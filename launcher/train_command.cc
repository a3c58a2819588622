// `troupe train`: GPT training in this process: one rank runs the reference
// loop (model/trainer.h); --pp/--dp run every rank as actors over the
// in-process transport (actors/runtime.h). Megatron-style flags; one progress
// line per step and, with --metrics-jsonl, one JSON object per step.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/runtime.h"
#include "launcher/commands.h"
#include "model/atomic_file.h"
#include "model/trainer.h"
#include "model/weights.h"

namespace troupe::launcher {
namespace {

struct TrainFlags {
  std::string model = "tiny";
  std::optional<int> layers, channels, heads, seq_len, vocab_size, vocab_multiple;
  model::TrainOptions options;
  std::string save_weights;
  std::string metrics_jsonl;
  actors::ParallelOptions parallel;
  std::string schedule = "1f1b";
  std::string fail_at;   // --debug-fail-stage S:K
  std::string stall_at;  // --debug-stall-stage S:K
};

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<std::int64_t>(s + 0.5);
  if (total >= 3600) return absl::StrFormat("%dh%02dm", total / 3600, (total / 60) % 60);
  if (total >= 60) return absl::StrFormat("%dm%02ds", total / 60, total % 60);
  return absl::StrFormat("%.1fs", s);
}

// Fails early (before any training) if `path` cannot be written: makes the
// temporary the save will make, and removes it.
absl::Status check_writable(const std::string& path, const char* flag) {
  absl::StatusOr<model::AtomicFile> probe = model::AtomicFile::create(path);
  if (!probe.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot write there (", probe.status().message(), ")"));
  }
  return absl::OkStatus();
}

// The progress line and the metrics JSONL, one of each per step.
class Progress {
 public:
  Progress(int steps, std::ofstream* metrics) : steps_(steps), metrics_(metrics) {}
  void report(const model::StepMetrics& m) {
    elapsed_ += m.step_s;
    const double eta = elapsed_ / m.step * (steps_ - m.step);
    const std::string val = m.val_loss ? absl::StrFormat(" | val loss %.4f", *m.val_loss) : "";
    std::printf(
        "step %*d/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | elapsed %s | ETA %s%s\n",
        static_cast<int>(std::to_string(steps_).size()), m.step, steps_, m.loss, m.lr,
        m.grad_norm, m.tokens_per_s, duration(elapsed_).c_str(), duration(eta).c_str(),
        val.c_str());
    std::fflush(stdout);
    if (metrics_ == nullptr) return;
    *metrics_ << absl::StrFormat(
        "{\"step\": %d, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, "
        "\"tokens_per_s\": %.9g, \"step_s\": %.9g, \"elapsed_s\": %.9g%s}\n",
        m.step, m.loss, m.grad_norm, m.lr, m.tokens_per_s, m.step_s, elapsed_,
        m.val_loss ? absl::StrFormat(", \"val_loss\": %.9g", *m.val_loss) : "");
    metrics_->flush();
  }

 private:
  int steps_;
  std::ofstream* metrics_;
  double elapsed_ = 0.0;
};

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

int run_train(const TrainFlags& flags) {
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "troupe train: error: %s\n", std::string(st.message()).c_str());
    return 1;
  };
  absl::StatusOr<model::TrainOptions> options = resolve(flags);
  if (!options.ok()) return fail(options.status());
  if (absl::Status st = flags.parallel.validate(*options); !st.ok()) return fail(st);
  if (!flags.save_weights.empty()) {
    if (absl::Status st = check_writable(flags.save_weights, "--save-weights"); !st.ok()) {
      return fail(st);
    }
  }
  std::ofstream metrics;
  if (!flags.metrics_jsonl.empty()) {
    metrics.open(flags.metrics_jsonl, std::ios::trunc);
    if (!metrics) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--metrics-jsonl ", flags.metrics_jsonl, ": cannot open for writing")));
    }
  }
  const model::TrainOptions& o = *options;
  const actors::ParallelOptions& par = flags.parallel;
  const bool one_rank = par.world() == 1 && par.virtual_stages == 1;
  Progress progress(o.steps, metrics.is_open() ? &metrics : nullptr);
  std::unique_ptr<model::Trainer> single;
  std::unique_ptr<actors::InProcessTrainer> multi;
  const model::data::SampleSource* train_data = nullptr;
  if (one_rank) {
    // One rank: the reference loop itself, no actors needed.
    absl::StatusOr<std::unique_ptr<model::Trainer>> t = model::Trainer::create(o);
    if (!t.ok()) return fail(t.status());
    single = std::move(*t);
    train_data = &single->train_data();
  } else {
    absl::StatusOr<std::unique_ptr<actors::InProcessTrainer>> t =
        actors::InProcessTrainer::create(o, par);
    if (!t.ok()) return fail(t.status());
    multi = std::move(*t);
    train_data = &multi->train_data();
  }
  // (With --tp the vocabulary is padded to a multiple of 128 x tp.)
  std::printf("troupe train: %s\n",
              (multi ? multi->options().model : o.model).describe().c_str());
  std::printf("  train data: %s\n", train_data->describe().c_str());
  const model::data::SampleSource* valid_data =
      single ? single->valid_data() : multi->valid_data();
  if (valid_data != nullptr) std::printf("  valid data: %s\n", valid_data->describe().c_str());
  if (one_rank) {
    std::printf("  micro-batch %d x %d accumulation = global batch %d; %d steps; 1 rank\n",
                o.micro_batch, o.grad_accum(), o.global_batch, o.steps);
  } else {
    const int m = par.m(o);
    std::printf(
        "  %s: %d ranks as actors in this process; schedule %s%s, %d micro-batches of %d per "
        "replica and step = global batch %d; %d steps\n",
        multi->layout().describe().c_str(), multi->layout().world(),
        actors::schedule_name(par.schedule).c_str(),
        par.virtual_stages > 1 ? absl::StrCat(" (", par.virtual_stages, " chunks per stage)").c_str()
                               : "",
        m, o.micro_batch, o.global_batch, o.steps);
    std::printf("  optimizer state per rank (ZeRO-1): %.2f MiB of %.2f MiB for the whole model\n",
                static_cast<double>(multi->optimizer_state_bytes(0)) / (1 << 20),
                static_cast<double>(multi->unpartitioned_state_bytes()) / (1 << 20));
  }
  std::fflush(stdout);

  if (single) {
    for (int i = 0; i < o.steps; i++) {
      model::StepMetrics m;
      if (absl::Status st = single->step(&m); !st.ok()) return fail(st);
      progress.report(m);
    }
  } else {
    absl::Status st = multi->run([&](const model::StepMetrics& m) { progress.report(m); });
    if (!st.ok()) return fail(st);
  }
  if (!flags.save_weights.empty()) {
    absl::Status st;
    if (single) {
      st = model::save_weights(single->gpt(), flags.save_weights);
    } else {
      // Gathered from every stage into the file one rank writes.
      model::Gpt whole(multi->options().model, 1, gpu::cpu_device());
      st = multi->gather_params(whole);
      if (st.ok()) st = model::save_weights(whole, flags.save_weights);
    }
    if (!st.ok()) return fail(st);
    std::printf("saved weights to %s\n", flags.save_weights.c_str());
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  model::TrainOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT (all ranks in this process)");
  cmd->add_option("--model", flags->model,
                  "Model preset: tiny, cpu-small, gpt2-124m, gpt2-350m, "
                  "gpt3-1.3b, gpt3-175b, mt-nlg-530b")
      ->capture_default_str();
  cmd->add_option("--layers,--num-layers", flags->layers, "Override L (layers)");
  cmd->add_option("--channels,--hidden-size", flags->channels, "Override C (channels)");
  cmd->add_option("--heads,--num-attention-heads", flags->heads, "Override NH (heads)");
  cmd->add_option("--seq-len,--seq-length", flags->seq_len, "Override T (sequence length)");
  cmd->add_option("--vocab-size", flags->vocab_size, "Override V (vocabulary size)");
  cmd->add_option("--make-vocab-size-divisible-by", flags->vocab_multiple,
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
  cmd->add_option("--save-weights", flags->save_weights,
                  "Write the final weights here (safetensors)");
  cmd->add_option("--metrics-jsonl", flags->metrics_jsonl, "Write one JSON object per step here");
  cmd->add_option("--threads", o.threads, "Compute threads (default: all cores)");
  actors::ParallelOptions& par = flags->parallel;
  cmd->add_option("--tp,--tensor-model-parallel-size", par.tp,
                  "Tensor-parallel ranks per stage (Megatron slicing)")
      ->capture_default_str();
  cmd->add_option("--pp,--pipeline-model-parallel-size", par.pp, "Pipeline stages")
      ->capture_default_str();
  cmd->add_option("--dp,--data-parallel-size", par.dp, "Data-parallel replicas (ZeRO-1)")
      ->capture_default_str();
  cmd->add_option("--schedule", flags->schedule, "Pipeline schedule: gpipe, 1f1b, interleaved")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", par.virtual_stages,
                  "Model chunks per stage (interleaved schedule)")
      ->capture_default_str();
  cmd->add_option("--stall-timeout", par.stall_timeout_s,
                  "Seconds without progress after which the run is hung: it stops and says what "
                  "every rank waits for (0: never)")
      ->capture_default_str();
  cmd->add_option("--debug-fail-stage", flags->fail_at,
                  "Testing: the shard of stage S throws at step K (S:K)")
      ->group("");
  cmd->add_option("--debug-stall-stage", flags->stall_at,
                  "Testing: the shard of stage S never starts step K (S:K)")
      ->group("");
  return [flags] {
    auto fail = [](const std::string& msg) {
      std::fprintf(stderr, "troupe train: error: %s\n", msg.c_str());
      return 1;
    };
    absl::StatusOr<actors::ScheduleKind> kind = actors::parse_schedule(flags->schedule);
    if (!kind.ok()) return fail(std::string(kind.status().message()));
    flags->parallel.schedule = *kind;
    if (!flags->fail_at.empty() &&
        std::sscanf(flags->fail_at.c_str(), "%d:%d", &flags->parallel.fail.stage,
                    &flags->parallel.fail.step) != 2) {
      return fail("--debug-fail-stage " + flags->fail_at + ": expected STAGE:STEP");
    }
    if (!flags->stall_at.empty()) {
      flags->parallel.fail.kind = actors::FailPoint::Kind::kStall;
      if (std::sscanf(flags->stall_at.c_str(), "%d:%d", &flags->parallel.fail.stage,
                      &flags->parallel.fail.step) != 2) {
        return fail("--debug-stall-stage " + flags->stall_at + ": expected STAGE:STEP");
      }
    }
    return run_train(*flags);
  };
}

}  // namespace troupe::launcher
