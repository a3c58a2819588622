// AdamW, learning-rate schedule and clipping.
#include "model/optimizer.h"

#include <cmath>
#include <numbers>

#include "gpu/ops.h"

namespace troupe::model {

namespace {

// Megatron's OptimizerParamScheduler.get_lr at num_steps `step` (steps or
// samples).
float scheduled_lr(const LrSchedule& s, std::int64_t step, std::int64_t warmup,
                   std::int64_t decay) {
  if (warmup > 0 && step <= warmup) {
    return s.lr * static_cast<float>(step) / static_cast<float>(warmup);
  }
  if (decay <= warmup) return s.lr;  // no decay configured
  if (step > decay) return s.min_lr;
  const double ratio = static_cast<double>(step - warmup) / static_cast<double>(decay - warmup);
  const double coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return static_cast<float>(s.min_lr + coeff * (s.lr - s.min_lr));
}

}  // namespace

float lr_at(const LrSchedule& s, int completed) {
  return scheduled_lr(s, completed, s.warmup_iters, s.decay_iters);
}

float lr_at_samples(const LrSchedule& s, std::int64_t consumed) {
  return scheduled_lr(s, consumed, s.warmup_samples, s.decay_samples);
}

float clip_factor(double grad_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double c = max_norm / (grad_norm + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0f;
}

AdamW::AdamW(const ParamLayout& layout, gpu::Device& device, gpu::Stream& s) : layout_(layout) {
  m_ = gpu::Tensor::empty(device, gpu::DType::kF32, {layout.total()});
  v_ = gpu::Tensor::empty(device, gpu::DType::kF32, {layout.total()});
  gpu::ops::fill(s, m_, 0.0f);
  gpu::ops::fill(s, v_, 0.0f);
}

void AdamW::step(gpu::Stream& s, const gpu::Tensor& params, const gpu::Tensor& grads,
                 const AdamWConfig& c, float lr, int step, float grad_scale,
                 const gpu::Tensor& compute) {
  std::vector<gpu::AdamWTensor> tensors;
  tensors.reserve(layout_.specs().size());
  for (const ParamSpec& spec : layout_.specs()) {
    tensors.push_back({.p = layout_.view(params, spec),
                       .g = layout_.view(grads, spec),
                       .m = layout_.view(m_, spec),
                       .v = layout_.view(v_, spec),
                       .weight_decay = spec.decay == Decay::kYes ? c.weight_decay : 0.0f,
                       .compute = compute.defined() ? layout_.view(compute, spec) : gpu::Tensor{}});
  }
  gpu::ops::adamw_many(s, tensors, c.step_args(lr, step, grad_scale));  // one launch on CUDA
}

}  // namespace troupe::model
