// --print-config.
#include "api/print_config.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actors/rank/memory_plan.h"
#include "api/flag_rules.h"
#include "api/recipe.h"

namespace troupe::api {
namespace {

std::string num(double v) { return absl::StrFormat("%.6g", v); }

}  // namespace

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
  add("--virtual-stages",
      par.v_shape ? absl::StrCat(par.virtual_stages, " (a V: stage s holds chunks s and 2pp-1-s)")
                  : absl::StrCat(par.virtual_stages),
      "default");
  if (par.schedule == actors::ScheduleKind::kZbAuto) {
    add("--zb-max-pending-w",
        par.zb_max_pending_w > 0 ? absl::StrCat(par.zb_max_pending_w, " per chunk")
        : par.v_shape            ? "ZB-V's (per chunk)"
                                 : "ZB-H1's (s + 1 on stage s)",
        "default");
  }
  out.push_back({"--bf16/--fp16", gpu::precision_name(o.activations.precision),
                 given(f, "--bf16") || given(f, "--fp16") ? "flag" : "default"});
  add("--tf32", o.tf32 ? "on" : "off", "default");
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
  // (troupe launch: each worker resolves its own device, and with it the
  // kernel; this is what this host's GPUs give.)
  out.push_back({"--attention-kernel", model::attention_kernel_name(o.activations.attention),
                 given(f, "--attention-kernel") ? "flag"
                 : f.device.empty() ? "default on this host; a worker takes its device's"
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
                          .precision = o.activations.precision,
                          .attention = o.activations.attention};
    absl::StatusOr<actors::MemoryParts> counted = actors::counted_memory(q);
    absl::StatusOr<actors::MemoryParts> paper = actors::paper_memory(q);
    if (!counted.ok()) return counted.status();
    if (!paper.ok()) return paper.status();
    constexpr double kMiB = 1 << 20;
    std::printf("  %-6d %12.1f %12.1f %12.1f %12.1f\n", s, counted->total() / kMiB,
                counted->activations / kMiB, paper->total() / kMiB, paper->activations / kMiB);
  }
  std::printf(
      "  counted: what troupe allocates (parameters and activations in the run's precision, "
      "fp32 gradients and ZeRO-1 state, activations of the micro-batches in flight, buffers);\n"
      "  16-bit: Korthikanti et al. 2022 for a Megatron bf16 run of the same layout (troupe "
      "plan --memory paper).\n");
  return absl::OkStatus();
}

}  // namespace troupe::api
