// Megatron's loss scaling and the step skip.
#include "model/loss_scale.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "model/optimizer.h"

namespace troupe::model {

absl::Status LossScaleOptions::validate() const {
  if (!(constant >= 0.0f) || std::isinf(constant)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--loss-scale must be positive and finite, is ", constant));
  }
  if (!(initial > 0.0f) || std::isinf(initial)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--initial-loss-scale must be positive and finite, is ", initial));
  }
  if (!(min > 0.0f) || min > initial) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min-loss-scale must be positive and at most --initial-loss-scale, is ", min));
  }
  if (window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--loss-scale-window must be at least 1, is ", window));
  }
  if (hysteresis < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hysteresis must be at least 1, is ", hysteresis));
  }
  return absl::OkStatus();
}

LossScaler::LossScaler(gpu::Precision precision, const LossScaleOptions& options)
    : precision_(precision), options_(options) {
  if (precision_ == gpu::Precision::kFp16) {
    state_.scale = options_.constant > 0 ? options_.constant : options_.initial;
  }
  state_.hysteresis_tracker = options_.hysteresis;
}

StepDecision LossScaler::decide(double squared_norm, float clip_grad, int samples) {
  StepDecision d;
  const bool found_inf = !std::isfinite(squared_norm);
  if (precision_ == gpu::Precision::kFp16 && found_inf) {
    d.skip = true;
    state_.skipped_iters++;
    state_.skipped_samples += samples;
  } else {
    // Unscaled: the scale is a power of two unless --loss-scale says
    // otherwise, so dividing the norm by it is exact.
    d.grad_norm = std::sqrt(squared_norm) / static_cast<double>(state_.scale);
    d.grad_scale = clip_factor(d.grad_norm, clip_grad) / state_.scale;
  }
  if (!dynamic()) return d;
  if (found_inf) {
    state_.growth_tracker = 0;
    if (--state_.hysteresis_tracker <= 0) {
      state_.scale = std::max(state_.scale * 0.5f, options_.min);
    }
  } else if (++state_.growth_tracker == options_.window) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = options_.hysteresis;
    state_.scale *= 2.0f;
  }
  return d;
}

}  // namespace troupe::model
