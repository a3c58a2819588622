// `troupe train`: GPT training, for now on one rank (the actors issue adds
// --tp/--pp/--dp). Megatron-style flags; one progress line per step and, with
// --metrics-jsonl, one JSON object per step.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/commands.h"
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
};

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<std::int64_t>(s + 0.5);
  if (total >= 3600) return absl::StrFormat("%dh%02dm", total / 3600, (total / 60) % 60);
  if (total >= 60) return absl::StrFormat("%dm%02ds", total / 60, total % 60);
  return absl::StrFormat("%.1fs", s);
}

// Fails early (before any training) if `path` cannot be written.
absl::Status check_writable(const std::string& path, const char* flag) {
  const std::string probe = path + ".tmp";
  {
    std::ofstream out(probe, std::ios::binary | std::ios::app);
    if (!out) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", path, ": cannot write there (missing directory or no permission)"));
    }
  }
  std::remove(probe.c_str());
  return absl::OkStatus();
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

int run_train(const TrainFlags& flags) {
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "troupe train: error: %s\n", std::string(st.message()).c_str());
    return 1;
  };
  absl::StatusOr<model::TrainOptions> options = resolve(flags);
  if (!options.ok()) return fail(options.status());
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
  absl::StatusOr<std::unique_ptr<model::Trainer>> trainer = model::Trainer::create(*options);
  if (!trainer.ok()) return fail(trainer.status());
  const model::TrainOptions& o = *options;
  std::printf("troupe train: %s\n", o.model.describe().c_str());
  std::printf("  train data: %s\n", (*trainer)->train_data().describe().c_str());
  if ((*trainer)->valid_data() != nullptr) {
    std::printf("  valid data: %s\n", (*trainer)->valid_data()->describe().c_str());
  }
  std::printf("  micro-batch %d x %d accumulation = global batch %d; %d steps; 1 rank\n",
              o.micro_batch, o.grad_accum(), o.global_batch, o.steps);
  std::fflush(stdout);

  double elapsed = 0.0;
  for (int i = 0; i < o.steps; i++) {
    model::StepMetrics m;
    if (absl::Status st = (*trainer)->step(&m); !st.ok()) return fail(st);
    elapsed += m.step_s;
    const double eta = elapsed / m.step * (o.steps - m.step);
    const std::string val = m.val_loss ? absl::StrFormat(" | val loss %.4f", *m.val_loss) : "";
    std::printf(
        "step %*d/%d | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | elapsed %s | ETA %s%s\n",
        static_cast<int>(std::to_string(o.steps).size()), m.step, o.steps, m.loss, m.lr,
        m.grad_norm, m.tokens_per_s, duration(elapsed).c_str(), duration(eta).c_str(), val.c_str());
    std::fflush(stdout);
    if (metrics.is_open()) {
      metrics << absl::StrFormat(
          "{\"step\": %d, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, "
          "\"tokens_per_s\": %.9g, \"step_s\": %.9g, \"elapsed_s\": %.9g%s}\n",
          m.step, m.loss, m.grad_norm, m.lr, m.tokens_per_s, m.step_s, elapsed,
          m.val_loss ? absl::StrFormat(", \"val_loss\": %.9g", *m.val_loss) : "");
      metrics.flush();
    }
  }
  if (!flags.save_weights.empty()) {
    if (absl::Status st = model::save_weights((*trainer)->gpt(), flags.save_weights); !st.ok()) {
      return fail(st);
    }
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
  return [flags] { return run_train(*flags); };
}

}  // namespace troupe::launcher
