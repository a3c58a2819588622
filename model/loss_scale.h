// Mixed precision's step rule: Megatron's loss scaling for --fp16, and the
// skipped steps it causes.
//
// Under --fp16 the loss is multiplied by the scale before the backward, so
// small gradients survive fp16's range; the optimizer divides it out. A
// step whose gradients are not finite (an fp16 store overflowed to inf) is
// skipped on every rank: no update, the learning-rate schedule and Adam's
// step count stand still, and the scale follows Megatron's
// DynamicGradScaler (megatron/core/optimizer/grad_scaler.py):
//   - found inf: the growth tracker restarts; the hysteresis tracker drops
//     by one, and once it is <= 0 the scale halves (not below --min-loss-scale);
//   - finite: after --loss-scale-window finite steps in a row the scale
//     doubles and the hysteresis tracker is refilled to --hysteresis.
// --loss-scale S fixes the scale (Megatron's ConstantGradScaler: steps with
// non-finite gradients are still skipped). Under --bf16 and fp32 the scale
// is 1 and nothing is skipped, as in Megatron.
//
//   model::LossScaler scaler(gpu::Precision::kFp16, options.loss_scale);
//   backward(dloss * scaler.scale());
//   model::StepDecision d = scaler.decide(squared_norm_of_grads, clip_grad);
//   if (!d.skip) adam.step(..., d.grad_scale);
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "gpu/precision.h"

namespace troupe::model {

struct LossScaleOptions {
  float constant = 0;             // --loss-scale: a fixed scale (0: dynamic)
  float initial = 4294967296.0f;  // --initial-loss-scale (2^32)
  float min = 1.0f;               // --min-loss-scale
  int window = 1000;              // --loss-scale-window
  int hysteresis = 2;             // --hysteresis
  absl::Status validate() const;  // InvalidArgument naming the flag
};

// What a checkpoint keeps (Megatron's grad scaler state dict, and the
// steps skipped so far, which the schedule and Adam do not count).
struct LossScaleState {
  float scale = 1.0f;
  int growth_tracker = 0;
  int hysteresis_tracker = 0;
  int skipped_iters = 0;             // steps skipped so far
  std::int64_t skipped_samples = 0;  // their samples
  bool operator==(const LossScaleState&) const = default;
};

// A step's outcome once its gradients' global squared norm is known.
struct StepDecision {
  bool skip = false;     // non-finite gradients under --fp16: no update
  double grad_norm = 0;  // of the unscaled gradients (0 when skipped)
  float grad_scale = 1;  // what AdamW multiplies each gradient by: clip / loss scale
};

// dloss, each token's weight in the backward: the mean over the global
// batch's `tokens`, times the loss scale (--fp16; a power of two unless
// --loss-scale says otherwise, so the product is exact).
inline float token_loss_weight(std::int64_t tokens, float loss_scale) {
  return 1.0f / static_cast<float>(tokens) * loss_scale;
}

class LossScaler {
 public:
  LossScaler(gpu::Precision precision, const LossScaleOptions& options);

  // The factor the loss is multiplied by in this step's backward.
  float scale() const { return state_.scale; }
  bool dynamic() const { return precision_ == gpu::Precision::kFp16 && options_.constant <= 0; }
  // Decides step `samples` (its global batch) from the squared norm of the
  // scaled loss's gradients (summed over every parameter once), clips to
  // clip_grad (<= 0: off), and updates the scale and the skip counts.
  StepDecision decide(double squared_norm, float clip_grad, int samples);

  const LossScaleState& state() const { return state_; }
  // A resume: the checkpoint's state (a fixed --loss-scale, or 1 outside
  // fp16, stays as configured, as Megatron's constant scaler keeps none).
  void restore(const LossScaleState& s) {
    const float scale = state_.scale;
    state_ = s;
    if (!dynamic()) state_.scale = scale;
  }

 private:
  gpu::Precision precision_;
  LossScaleOptions options_;
  LossScaleState state_;
};

}  // namespace troupe::model
