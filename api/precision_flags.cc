// What a run computes in and what it keeps: --bf16, --fp16 and the
// loss-scaling flags; --recompute-granularity, --recompute-method,
// --recompute-num-layers, --recompute-activations.
#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"

namespace troupe::api {

// Megatron's rules: a method and a layer count only with full recompute;
// full without a method recomputes uniformly, a layer a group (what MT-NLG
// and Megatron's older --checkpoint-activations did).
absl::Status resolve_recompute(const TrainFlags& f, model::ActivationOptions* a) {
  std::string granularity = f.recompute_granularity;
  if (f.recompute_activations) {
    if (!granularity.empty() && granularity != "selective") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--recompute-activations means --recompute-granularity selective, not ", granularity));
    }
    granularity = "selective";
  }
  if (!granularity.empty()) {
    absl::StatusOr<model::Recompute> r = model::parse_recompute_granularity(granularity);
    if (!r.ok()) return r.status();
    a->recompute = *r;
  }
  if (a->recompute != model::Recompute::kFull &&
      (!f.recompute_method.empty() || f.recompute_layers)) {
    return absl::InvalidArgumentError(
        "--recompute-method and --recompute-num-layers need --recompute-granularity full");
  }
  if (!f.recompute_method.empty()) {
    absl::StatusOr<model::RecomputeMethod> m = model::parse_recompute_method(f.recompute_method);
    if (!m.ok()) return m.status();
    a->method = *m;
  }
  if (f.recompute_layers) a->recompute_layers = *f.recompute_layers;
  return a->validate();
}

absl::Status resolve_attention(const TrainFlags& f, model::ActivationOptions* a) {
  if (f.attention_kernel.empty()) {
    // (troupe launch resolves the device on each worker: here a host whose
    // GPU a worker would take counts as cuda, for the banner and
    // --print-config's memory.)
    std::string device = f.device;
    if (device.empty()) {
      TrainFlags probe = f;
      resolve_device(probe, /*process_per_rank=*/true, f.parallel.world());
      device = probe.device;
    }
    a->attention = model::resolve_attention_kernel(
        model::AttentionKernel::kDefault,
        device == "cuda" ? gpu::DeviceKind::kCuda : gpu::DeviceKind::kCpu);
    return absl::OkStatus();
  }
  absl::StatusOr<model::AttentionKernel> k = model::parse_attention_kernel(f.attention_kernel);
  if (!k.ok()) return k.status();
  a->attention = *k;
  return absl::OkStatus();
}

// --bf16 or --fp16 (Megatron: not both); the loss-scaling flags only with
// --fp16, whose gradients they scale.
absl::Status resolve_precision(const TrainFlags& f, model::TrainOptions* o) {
  if (f.bf16 && f.fp16) return absl::InvalidArgumentError("--bf16 and --fp16: give one of them");
  o->activations.precision = f.bf16   ? gpu::Precision::kBf16
                             : f.fp16 ? gpu::Precision::kFp16
                                      : gpu::Precision::kFp32;
  if (!f.fp16) {
    for (const CLI::Option* flag : f.loss_scale_flags) {
      if (given(flag)) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag->get_name(), " needs --fp16 (loss scaling is fp16's; bf16 and fp32 need none)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace troupe::api
