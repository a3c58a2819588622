// --recipe and --print-config.
#include "api/train_config.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actors/rank/memory_plan.h"

namespace troupe::api {
namespace {

// MT-NLG 530B's optimizer and schedule: Smith et al. 2022, "Using DeepSpeed
// and Megatron to Train Megatron-Turing NLG 530B" (arXiv 2201.11990),
// section 3 (model and training), whose sentences each value quotes.
struct Recipe {
  // "The sequence length is 2048 and the global batch size is 1920."
  int seq_len = 2048;
  int global_batch = 1920;
  // "The learning rate is 5.0e-5."
  float lr = 5.0e-5f;
  // "We used one billion tokens for linear learning rate warmup."
  double warmup_tokens = 1e9;
  // "We used cosine decay for the learning rate targeting to reach 10% of
  // its value over 340 billion tokens."
  float min_lr_fraction = 0.1f;
  double decay_tokens = 340e9;
  // "Over the first 12 billion tokens, we started at a batch size of 32 and
  // gradually increased the batch size in increments of 32, until we reach
  // the final batch size of 1920."
  int rampup_start = 32, rampup_increment = 32;
  double rampup_tokens = 12e9;
  // "We used Adam optimizer with beta1 = 0.9, beta2 = 0.95, and epsilon =
  // 1e-8. We clipped the gradient norm at 1.0 and used a weight decay of 0.1."
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, clip = 1.0f, weight_decay = 0.1f;
  // "For weight initialization, we used a normal distribution with zero
  // mean and a standard deviation of 4.0e-3."
  double init_std = 4.0e-3;
  // The run: 270 billion tokens (the paper's training set; Microsoft and
  // NVIDIA's announcement of 2021-10-11: "a training dataset with 270
  // billion tokens"). The cosine decay's 340B is its target, not the run.
  double train_tokens = 270e9;
};

bool given(const TrainFlags& f, const std::string& name) {
  for (const CLI::Option* o : f.registered) {
    if (o->count() == 0) continue;
    for (const std::string& n : o->get_lnames()) {
      if ("--" + n == name) return true;
    }
  }
  return false;
}

std::string num(double v) { return absl::StrFormat("%.6g", v); }

}  // namespace

absl::Status check_recipe(const std::string& name) {
  if (name.empty() || name == "mt-nlg") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--recipe ", name, ": unknown; known: mt-nlg"));
}

std::set<std::string> apply_recipe(const std::string& name, const TrainFlags& f,
                                   model::TrainOptions* o) {
  std::set<std::string> set;
  if (name != "mt-nlg") return set;
  const Recipe r;
  auto apply = [&](const char* flag, auto* field, auto value) {
    if (given(f, flag)) return;
    *field = value;
    set.insert(flag);
  };
  apply("--seq-length", &o->model.T, r.seq_len);
  apply("--global-batch-size", &o->global_batch, r.global_batch);
  apply("--init-method-std", &o->model.init_std, r.init_std);
  apply("--lr", &o->lr.lr, r.lr);
  // The peak rate may be a flag's: the floor stays 10% of it.
  apply("--min-lr", &o->lr.min_lr, r.min_lr_fraction * o->lr.lr);
  const double T = o->model.T;  // tokens a sample
  apply("--lr-warmup-samples", &o->lr.warmup_samples,
        static_cast<std::int64_t>(r.warmup_tokens / T));
  apply("--lr-decay-samples", &o->lr.decay_samples, static_cast<std::int64_t>(r.decay_tokens / T));
  if (!given(f, "--rampup-batch-size")) {
    o->rampup = {.start = r.rampup_start,
                 .increment = r.rampup_increment,
                 .samples = static_cast<std::int64_t>(r.rampup_tokens / T)};
    set.insert("--rampup-batch-size");
  }
  apply("--adam-beta1", &o->adam.beta1, r.beta1);
  apply("--adam-beta2", &o->adam.beta2, r.beta2);
  apply("--adam-eps", &o->adam.eps, r.eps);
  apply("--clip-grad", &o->clip_grad, r.clip);
  apply("--weight-decay", &o->adam.weight_decay, r.weight_decay);
  // The run's length: the paper's, unless --train-samples says.
  if (!given(f, "--train-samples") && !given(f, "--steps")) {
    o->train_samples = static_cast<std::int64_t>(r.train_tokens / T);
    set.insert("--train-samples");
  }
  return set;
}

absl::Status explain_recipe(const absl::Status& st, const std::string& recipe,
                            const std::set<std::string>& recipe_set) {
  if (st.ok()) return st;
  for (const std::string& flag : recipe_set) {
    if (absl::StartsWith(st.message(), flag)) {
      return absl::Status(st.code(), absl::StrCat(st.message(), " (", flag, " is --recipe ", recipe,
                                                  "'s; give it to change it)"));
    }
  }
  return st;
}

std::vector<ConfigValue> describe_config(const TrainFlags& f, const model::TrainOptions& o,
                                         const std::set<std::string>& recipe_set) {
  std::vector<ConfigValue> out;
  const std::string recipe = absl::StrCat("recipe ", f.recipe);
  auto source = [&](const std::string& flag, const char* otherwise) -> std::string {
    if (given(f, flag)) return "flag";
    if (recipe_set.contains(flag)) return recipe;
    return otherwise;
  };
  auto add = [&](const std::string& flag, const std::string& value, const char* otherwise) {
    out.push_back({flag, value, source(flag, otherwise)});
  };
  const std::string preset = absl::StrCat("preset ", f.model);
  const model::GptConfig& c = o.model;
  add("--model", f.model, "default");
  add("--num-layers", absl::StrCat(c.L), preset.c_str());
  add("--hidden-size", absl::StrCat(c.C), preset.c_str());
  add("--num-attention-heads", absl::StrCat(c.NH), preset.c_str());
  add("--seq-length", absl::StrCat(c.T), preset.c_str());
  add("--vocab-size", absl::StrCat(c.V), preset.c_str());
  add("--make-vocab-size-divisible-by", absl::StrCat(c.vocab_multiple), "default");
  add("--init-method-std", num(c.init_std), "default");
  add("--micro-batch-size", absl::StrCat(o.micro_batch), "default");
  add("--global-batch-size", absl::StrCat(o.global_batch),
      given(f, "--global-batch-size") ? "flag" : "derived");
  add("--rampup-batch-size",
      o.rampup.enabled()
          ? absl::StrCat(o.rampup.start, " ", o.rampup.increment, " ", o.rampup.samples)
          : "none",
      "default");
  if (o.train_samples > 0) add("--train-samples", absl::StrCat(o.train_samples), "default");
  out.push_back({"--train-iters", absl::StrCat(o.steps),
                 o.train_samples > 0 ? "derived" : source("--steps", "default")});
  add("--lr", num(o.lr.lr), "default");
  add("--min-lr", num(o.lr.min_lr), "default");
  if (o.train_samples > 0) {
    add("--lr-warmup-samples", absl::StrCat(o.lr.warmup_samples), "default");
    add("--lr-decay-samples", absl::StrCat(o.lr.decay_samples), "derived");
  } else {
    add("--lr-warmup-iters", absl::StrCat(o.lr.warmup_iters), "default");
    add("--lr-decay-iters", absl::StrCat(o.lr.decay_iters), "derived");
  }
  add("--lr-decay-style", "cosine", "default");
  add("--adam-beta1", num(o.adam.beta1), "default");
  add("--adam-beta2", num(o.adam.beta2), "default");
  add("--adam-eps", num(o.adam.eps), "default");
  add("--weight-decay", num(o.adam.weight_decay), "default");
  add("--clip-grad", num(o.clip_grad), "default");
  add("--seed", absl::StrCat(o.seed), "default");
  add("--data-path",
      o.data_path.empty() ? "synthetic phrase corpus" : absl::StrJoin(o.data_path, " "), "default");
  add("--split", o.split, "default");
  add("--data-cache-path", o.data_cache_path.empty() ? "DATA_DIR/cache" : o.data_cache_path,
      "default");
  out.push_back({"--no-shuffle", o.shuffle ? "no (shuffled)" : "yes",
                 given(f, "--no-shuffle") ? "flag" : "default"});
  add("--eval-interval", o.eval_interval > 0 ? absl::StrCat(o.eval_interval) : "never", "default");
  add("--eval-iters", absl::StrCat(o.eval_iters), o.eval_interval > 0 ? "derived" : "default");
  add("--init-weights", o.init_weights.empty() ? "none (the seed)" : o.init_weights, "default");
  const actors::CheckpointOptions& ck = f.checkpoint;
  add("--save", ck.save.empty() ? "none" : ck.save, "default");
  if (!ck.save.empty()) {
    add("--save-interval", ck.save_interval > 0 ? absl::StrCat(ck.save_interval) : "the last step",
        "default");
  }
  add("--load", ck.load.empty() ? "none" : ck.load, "default");
  const actors::ParallelOptions& par = f.parallel;
  add("--tensor-model-parallel-size", absl::StrCat(par.tp), "default");
  add("--pipeline-model-parallel-size", absl::StrCat(par.pp), "default");
  add("--data-parallel-size", absl::StrCat(par.dp), "default");
  add("--schedule", actors::schedule_name(par.schedule), "default");
  add("--virtual-stages", absl::StrCat(par.virtual_stages), "default");
  out.push_back({"--bf16/--fp16", gpu::precision_name(o.activations.precision),
                 given(f, "--bf16") || given(f, "--fp16") ? "flag" : "default"});
  if (o.activations.precision == gpu::Precision::kFp16) {
    if (o.loss_scale.constant > 0) {
      add("--loss-scale", num(o.loss_scale.constant), "default");
    } else {
      add("--initial-loss-scale", num(o.loss_scale.initial), "default");
      add("--min-loss-scale", num(o.loss_scale.min), "default");
      add("--loss-scale-window", absl::StrCat(o.loss_scale.window), "default");
      add("--hysteresis", absl::StrCat(o.loss_scale.hysteresis), "default");
    }
  }
  out.push_back({"--sequence-parallel", o.activations.sequence_parallel ? "yes" : "no",
                 given(f, "--sequence-parallel") ? "flag" : "default"});
  out.push_back({"--recompute-granularity", model::recompute_name(o.activations.recompute),
                 given(f, "--recompute-granularity") || given(f, "--recompute-activations")
                     ? "flag"
                     : "default"});
  if (o.activations.recompute == model::Recompute::kFull) {
    add("--recompute-method", model::recompute_method_name(o.activations.method), "default");
    add("--recompute-num-layers", absl::StrCat(o.activations.recompute_layers), "default");
  }
  add("--log-interval",
      absl::StrCat(f.log_interval > 0 ? f.log_interval : default_log_interval(o.steps)), "derived");
  add("--threads", o.threads > 0 ? absl::StrCat(o.threads) : "all cores", "default");
  return out;
}

absl::Status print_config(const TrainFlags& f, const model::TrainOptions& o,
                          const std::set<std::string>& recipe_set) {
  std::printf("troupe train: the resolved configuration (nothing is trained)\n");
  const std::vector<ConfigValue> values = describe_config(f, o, recipe_set);
  std::size_t width = 0;
  for (const ConfigValue& v : values) width = std::max(width, v.flag.size());
  for (const ConfigValue& v : values) {
    std::printf("  %-*s  %-24s  (%s)\n", static_cast<int>(width), v.flag.c_str(), v.value.c_str(),
                v.source.c_str());
  }
  if (!f.recipe.empty()) {
    std::printf("  (recipe %s: Smith et al. 2022, arXiv 2201.11990; tokens as samples of %d)\n",
                f.recipe.c_str(), o.model.T);
  }
  const actors::ParallelOptions& par = f.parallel;
  if (absl::Status st = par.validate(o); !st.ok()) return explain_recipe(st, f.recipe, recipe_set);
  std::printf("\nmemory per rank (MiB), the stage's largest rank, at the full global batch:\n");
  std::printf("  %-6s %12s %12s %12s %12s\n", "stage", "counted", "activations", "16-bit",
              "activations");
  for (int s = 0; s < par.pp; s++) {
    actors::MemoryQuery q{.config = o.model,
                          .parallel = par,
                          .micro_batch = o.micro_batch,
                          .global_batch = o.global_batch,
                          .stage = s,
                          .recompute = o.activations.recompute,
                          .recompute_method = o.activations.method,
                          .recompute_layers = o.activations.recompute_layers,
                          .sequence_parallel = o.activations.sequence_parallel,
                          .precision = o.activations.precision};
    absl::StatusOr<actors::MemoryParts> counted = actors::counted_memory(q);
    absl::StatusOr<actors::MemoryParts> paper = actors::paper_memory(q);
    if (!counted.ok()) return counted.status();
    if (!paper.ok()) return paper.status();
    constexpr double kMiB = 1 << 20;
    std::printf("  %-6d %12.1f %12.1f %12.1f %12.1f\n", s, counted->total() / kMiB,
                counted->activations / kMiB, paper->total() / kMiB, paper->activations / kMiB);
  }
  std::printf(
      "  counted: what troupe allocates (fp32 parameters, gradients, ZeRO-1 state, activations "
      "of the micro-batches in flight, buffers);\n"
      "  16-bit: Korthikanti et al. 2022 for a Megatron bf16 run of the same layout (troupe "
      "plan --memory paper).\n");
  return absl::OkStatus();
}

}  // namespace troupe::api
