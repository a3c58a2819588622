// GPT presets and configuration checks.
#include "model/config.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace troupe::model {
namespace {

struct Preset {
  const char* name;
  int L, C, NH, T, V;
};

// GPT-2 sizes as released by OpenAI; GPT-3 sizes from Brown et al. (2020),
// head size 128 for 1.3B as Megatron configures it; MT-NLG from Smith et al.
// (2022).
constexpr std::array<Preset, 7> kPresets{{
    {"tiny", 4, 64, 4, 64, 512},
    {"cpu-small", 4, 256, 4, 256, 50257},
    {"gpt2-124m", 12, 768, 12, 1024, 50257},
    {"gpt2-350m", 24, 1024, 16, 1024, 50257},
    {"gpt3-1.3b", 24, 2048, 16, 2048, 50257},
    {"gpt3-175b", 96, 12288, 96, 2048, 50257},
    {"mt-nlg-530b", 105, 20480, 128, 2048, 50257},
}};

}  // namespace

std::int64_t GptConfig::num_parameters() const {
  const std::int64_t c = C;
  const std::int64_t per_layer = 12 * c * c + 13 * c;  // qkv, proj, fc, fcproj, 2 LN
  return static_cast<std::int64_t>(V) * c + static_cast<std::int64_t>(T) * c + L * per_layer +
         2 * c;
}

double GptConfig::flops_per_token(int seq_len) const {
  const double c = C;
  const double matmul_params = L * 12.0 * c * c + static_cast<double>(V) * c;
  // Attention: q.k^T and att.v, each 2*T*C multiply-adds per token forward.
  const double attention = L * 2.0 * 2.0 * seq_len * c;
  return 3.0 * (2.0 * matmul_params + attention);
}

absl::Status GptConfig::validate() const {
  auto positive = [](const char* flag, int v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, is ", v));
  };
  for (absl::Status s : {positive("--layers", L), positive("--channels", C),
                         positive("--heads", NH), positive("--seq-len", T),
                         positive("--vocab-size", V), positive("vocab multiple", vocab_multiple)}) {
    if (!s.ok()) return s;
  }
  if (!(init_std > 0.0) || init_std > 1.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--init-method-std must be in (0, 1], is ", init_std));
  }
  if (C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--channels ", C, " is not a multiple of --heads ", NH));
  }
  return absl::OkStatus();
}

std::string GptConfig::describe() const {
  return absl::StrCat(name, ": L=", L, " C=", C, " NH=", NH, " T=", T, " V=", V, " (Vp=", Vp(),
                      "), ", num_parameters(), " parameters");
}

absl::StatusOr<GptConfig> preset(absl::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      GptConfig c;
      c.name = p.name;
      c.L = p.L;
      c.C = p.C;
      c.NH = p.NH;
      c.T = p.T;
      c.V = p.V;
      return c;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("unknown model '", name, "'; known: ", absl::StrJoin(preset_names(), ", ")));
}

absl::StatusOr<Recompute> parse_recompute_granularity(absl::string_view name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("--recompute-granularity '", name, "': use full or selective (none: off)"));
}

absl::StatusOr<RecomputeMethod> parse_recompute_method(absl::string_view name) {
  if (name == "uniform") return RecomputeMethod::kUniform;
  if (name == "block") return RecomputeMethod::kBlock;
  return absl::InvalidArgumentError(
      absl::StrCat("--recompute-method '", name, "': use uniform or block"));
}

std::string recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

absl::StatusOr<AttentionKernel> parse_attention_kernel(absl::string_view name) {
  if (name == "flash") return AttentionKernel::kFlash;
  if (name == "reference") return AttentionKernel::kReference;
  return absl::InvalidArgumentError(
      absl::StrCat("--attention-kernel '", name, "': use flash or reference"));
}

std::string attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kDefault:
      return "default";
    case AttentionKernel::kFlash:
      return "flash";
    case AttentionKernel::kReference:
      return "reference";
  }
  return "?";
}

// Set to true once scripts/gpu-check has run the CUDA flash kernels' op
// suite on a GPU (docs/CUDA.md); until then CUDA defaults to the reference
// kernel, which has.
constexpr bool kCudaFlashVerified = false;

bool cuda_flash_verified() { return kCudaFlashVerified; }

AttentionKernel resolve_attention_kernel(AttentionKernel k, gpu::DeviceKind kind) {
  if (k != AttentionKernel::kDefault) return k;
  return kind == gpu::DeviceKind::kCuda && !kCudaFlashVerified ? AttentionKernel::kReference
                                                               : AttentionKernel::kFlash;
}

std::string recompute_method_name(RecomputeMethod m) {
  return m == RecomputeMethod::kUniform ? "uniform" : "block";
}

absl::Status ActivationOptions::validate() const {
  if (recompute_layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recompute-num-layers must be at least 1, is ", recompute_layers));
  }
  return absl::OkStatus();
}

std::string ActivationOptions::describe() const {
  std::string out = recompute_name(recompute);
  if (recompute == Recompute::kSelective && !recomputes_scores()) {
    absl::StrAppend(&out, " (nothing to recompute: flash attention keeps no scores)");
  }
  if (recompute == Recompute::kFull && method == RecomputeMethod::kUniform) {
    absl::StrAppend(&out, " (uniform: groups of ", recompute_layers, " layer",
                    recompute_layers == 1 ? "" : "s", ")");
  } else if (recompute == Recompute::kFull) {
    absl::StrAppend(&out, " (block: the first ", recompute_layers, " layer",
                    recompute_layers == 1 ? "" : "s", " of each chunk)");
  }
  if (sequence_parallel) absl::StrAppend(&out, ", sequence parallel");
  absl::StrAppend(&out, ", ", attention_kernel_name(attention), " attention");
  if (precision != gpu::Precision::kFp32)
    absl::StrAppend(&out, ", ", gpu::precision_name(precision));
  return out;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace troupe::model
