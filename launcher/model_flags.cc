// Loading a trained model for generation, evaluation and serving.
#include "launcher/model_flags.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"

namespace troupe::launcher {

void add_model_flags(CLI::App* cmd, ModelFlags& f) {
  cmd->add_option("--weights", f.weights,
                  "The model's weights (safetensors: troupe's --save-weights, or Hugging Face "
                  "GPT-2's)");
  cmd->add_option("--load", f.load, "A checkpoint: a save directory (its newest) or DIR/iter_N");
  cmd->add_option("--model", f.model,
                  "Preset of a weights file without troupe's metadata (e.g. gpt2-124m)");
  cmd->add_option("--tp", f.tp, "Tensor-parallel shards of each stage")->capture_default_str();
  cmd->add_option("--pp", f.pp, "Pipeline stages")->capture_default_str();
  cmd->add_option("--threads", f.threads,
                  "Threads per shard (default: the cores shared among the shards)");
  cmd->add_option("--device", f.device,
                  "cpu or cuda, as troupe train's (default: cuda where this host has a usable "
                  "GPU and --tp is 1, else cpu); opaque: the CPU's kernels on memory the host "
                  "may not read, which tests the device path where no GPU is")
      ->envname("TROUPE_DEVICE")
      ->type_name("cpu|cuda|opaque");
  cmd->add_flag("--bf16", f.bf16,
                "Compute in bf16: parameters, KV cache, activations and logits (sampling in fp32)");
  cmd->add_flag("--fp16", f.fp16, "Compute in fp16, as --bf16");
  cmd->add_option("--attention-kernel", f.attention_kernel,
                  "flash (no T x T scratch) or reference, as troupe train's (default: flash, but "
                  "reference on cuda until scripts/gpu-check has verified the flash kernel)")
      ->type_name("flash|reference");
  cmd->add_option("--vocab-file", f.vocab_file, "GPT-2 BPE vocabulary: encoder.json or vocab.json")
      ->required();
  cmd->add_option("--merge-file", f.merge_file, "GPT-2 BPE merges: vocab.bpe or merges.txt")
      ->required();
}

namespace {

std::string describe(const model::GptConfig& c) {
  return absl::StrCat("L=", c.L, " C=", c.C, " NH=", c.NH, " T=", c.T, " V=", c.V);
}

}  // namespace

absl::StatusOr<LoadedModel> load_model(const ModelFlags& f) {
  if (f.weights.empty() == f.load.empty()) {
    return absl::InvalidArgumentError("give the model as one of --weights FILE or --load CKPT");
  }
  if (f.tp < 1 || f.pp < 1) return absl::InvalidArgumentError("--tp and --pp must be positive");
  if (f.threads < 0) return absl::InvalidArgumentError("--threads must be positive");
  if (f.bf16 && f.fp16) return absl::InvalidArgumentError("--bf16 and --fp16: give one of them");
  LoadedModel out;
  // The device as troupe train picks and checks it, for this process's
  // tp x pp shards (one replica).
  api::TrainFlags device_flags;
  device_flags.device = f.device;
  device_flags.parallel.tp = f.tp;
  device_flags.parallel.pp = f.pp;
  const std::string device_note = api::resolve_device(device_flags, /*process_per_rank=*/false);
  if (device_flags.device == "cuda" && f.tp > 1) {  // (train's message speaks of troupe launch)
    return absl::InvalidArgumentError(absl::StrCat(
        "--device cuda with --tp ", f.tp,
        ": the shards of one process would share its GPU, and the in-process TP collectives are "
        "the CPU's; give --tp 1 (--pp splits the layers) or --device cpu"));
  }
  device_flags.attention_kernel = f.attention_kernel;
  model::ActivationOptions acts;
  if (absl::Status st = api::resolve_attention(device_flags, &acts); !st.ok()) return st;
  absl::StatusOr<api::RunDevice> dev = api::open_device(device_flags);
  if (!dev.ok()) return dev.status();
  out.device = std::move(*dev);
  absl::StatusOr<std::unique_ptr<model::data::Gpt2Vocab>> vocab =
      model::data::Gpt2Vocab::load(f.vocab_file, f.merge_file);
  if (!vocab.ok()) return vocab.status();
  out.vocab = std::move(*vocab);
  model::GptConfig config;
  actors::ParamLoader loader;
  std::optional<model::ckpt::Checkpoint> ckpt;
  if (!f.weights.empty()) {
    model::GptConfig base = *model::preset("gpt2-124m");
    if (!f.model.empty()) {
      absl::StatusOr<model::GptConfig> p = model::preset(f.model);
      if (!p.ok())
        return absl::InvalidArgumentError(absl::StrCat("--model: ", p.status().message()));
      base = *p;
    }
    absl::StatusOr<model::GptConfig> c = model::weights_config(f.weights, base);
    if (!c.ok()) return c.status();
    config = *c;
    loader = [path = f.weights](const model::GptConfig& c, const model::ParamLayout& l, float* p) {
      return model::load_weights_slice(path, c, l, p);
    };
    out.description = absl::StrCat("weights ", f.weights, " (", describe(config), ")");
  } else {
    absl::StatusOr<model::ckpt::Checkpoint> c = model::ckpt::Checkpoint::open(f.load);
    if (!c.ok()) return c.status();
    ckpt.emplace(std::move(*c));
    config = ckpt->meta().options.model;
    loader = [&ckpt](const model::GptConfig&, const model::ParamLayout& l, float* p) {
      return ckpt->fill({.kind = model::ckpt::Kind::kParam,
                         .layout = &l,
                         .begin = 0,
                         .end = l.total(),
                         .data = p});
    };
    out.description = absl::StrCat("checkpoint ", ckpt->dir(), " (step ", ckpt->meta().step, ", ",
                                   describe(config), ")");
  }
  if (out.vocab->size() != config.V) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab-file ", f.vocab_file, " has ",
                                                   out.vocab->size(), " ids; the model has ",
                                                   config.V));
  }
  const int shards = f.tp * f.pp;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = f.threads > 0 ? f.threads : std::max(1, cores / shards);
  const gpu::Precision precision = f.bf16   ? gpu::Precision::kBf16
                                   : f.fp16 ? gpu::Precision::kFp16
                                            : gpu::Precision::kFp32;
  absl::StatusOr<std::unique_ptr<actors::ShardedModel>> lm =
      actors::ShardedModel::create(config, {.tp = f.tp, .pp = f.pp}, loader,
                                   {.device = out.device.device,
                                    .precision = precision,
                                    .threads = threads,
                                    .attention = acts.attention});
  if (!lm.ok()) return lm.status();
  out.lm = std::move(*lm);
  absl::StrAppend(
      &out.description, ", tp ", f.tp, " x pp ", f.pp, ", ", gpu::precision_name(precision), ", ",
      model::attention_kernel_name(acts.attention), " attention on ", out.device.device->name());
  if (out.device.device == &gpu::cpu_device()) {
    absl::StrAppend(&out.description, ", ", threads, threads == 1 ? " thread" : " threads",
                    " per shard");
  }
  if (!device_note.empty()) absl::StrAppend(&out.description, " (", device_note, ")");
  return out;
}

}  // namespace troupe::launcher
