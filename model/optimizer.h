// AdamW over a flat parameter buffer (decoupled weight decay; none on biases
// and LayerNorm parameters, as Megatron), the Megatron learning-rate schedule,
// and global gradient-norm clipping.
//
//   model::AdamW adam(layout, device, stream);
//   float lr = model::lr_at(schedule, steps_done);
//   adam.step(stream, params, grads, {.lr = lr, ...}, step, clip_factor);
#pragma once

#include <vector>

#include "gpu/device.h"
#include "gpu/kernels.h"
#include "model/layout.h"

namespace troupe::model {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;  // as MT-NLG
  float eps = 1e-8f;
  float weight_decay = 0.1f;

  // One step's arguments of the op (gpu::ops::adamw_many, each tensor with
  // its own decay): this config's betas and eps, the step's rate, 1-based
  // step and gradient factor (the clip).
  gpu::AdamWArgs step_args(float lr, int step, float grad_scale) const {
    gpu::AdamWArgs a;
    a.lr = lr;
    a.beta1 = beta1;
    a.beta2 = beta2;
    a.eps = eps;
    a.step = step;
    a.grad_scale = grad_scale;
    return a;
  }
};

// Linear warm-up to `lr` over `warmup_iters`, then cosine decay to `min_lr`
// at `decay_iters`, constant after (Megatron's --lr-warmup-iters,
// --lr-decay-iters, --min-lr). A run of --train-samples counts samples
// instead (--lr-warmup-samples, --lr-decay-samples), so that runs whose
// batch sizes differ (a ramp-up) see the same rate at the same sample.
struct LrSchedule {
  float lr = 6e-4f;
  float min_lr = 0.0f;
  int warmup_iters = 0;
  int decay_iters = 0;  // 0: no decay (constant after warm-up)
  std::int64_t warmup_samples = 0;
  std::int64_t decay_samples = 0;  // 0: no decay
};

// Learning rate of the update made after `completed` optimizer steps, as
// Megatron's OptimizerParamScheduler computes it from its num_steps: the
// first update of a run uses completed = 0 (so with warm-up it is init_lr,
// 0), and the last of a run decaying over all its steps is not yet at
// min_lr (a regression: step k once used num_steps = k, so the last update
// of such a run had lr = min_lr, by default 0, and did nothing).
float lr_at(const LrSchedule& schedule, int completed);
// The same by samples: the update made after `consumed` samples.
float lr_at_samples(const LrSchedule& schedule, std::int64_t consumed);

// Megatron's and PyTorch's clip factor: min(1, max_norm / (norm + 1e-6)).
// max_norm <= 0 disables clipping.
float clip_factor(double grad_norm, float max_norm);

class AdamW {
 public:
  // Moments for every parameter of `layout`, zeroed on `s`.
  AdamW(const ParamLayout& layout, gpu::Device& device, gpu::Stream& s);

  // One update of `params` from `grads` (flat buffers of layout.total()),
  // the gradient first multiplied by `grad_scale`. `step` is 1-based. With
  // `compute` (a bf16/f16 buffer of layout.total()), the updated fp32
  // params are also rounded into it in the same pass.
  void step(gpu::Stream& s, const gpu::Tensor& params, const gpu::Tensor& grads,
            const AdamWConfig& config, float lr, int step, float grad_scale,
            const gpu::Tensor& compute = {});

  const gpu::Tensor& m() const { return m_; }
  const gpu::Tensor& v() const { return v_; }

 private:
  const ParamLayout& layout_;
  gpu::Tensor m_, v_;
};

}  // namespace troupe::model
