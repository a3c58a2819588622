// Batch-size ramp-up as Megatron computes it.
#include "model/batch_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace troupe::model {

absl::Status check_rampup(const RampUp& r, int global_batch, int replica_batch) {
  if (!r.enabled()) return absl::OkStatus();
  const std::string flag =
      absl::StrCat("--rampup-batch-size ", r.start, " ", r.increment, " ", r.samples, ": ");
  if (r.start < 0 || r.increment <= 0 || r.samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "expected START > 0, INCREMENT > 0 and SAMPLES >= 0"));
  }
  if (r.start > global_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "START is more than --global-batch-size ", global_batch));
  }
  if ((global_batch - r.start) % r.increment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "--global-batch-size ", global_batch,
                                                   " minus START is not a multiple of INCREMENT"));
  }
  if (r.start % replica_batch != 0 || r.increment % replica_batch != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "START and INCREMENT must be multiples of --micro-batch-size x data-parallel size = ",
        replica_batch));
  }
  return absl::OkStatus();
}

int rampup_batch(const RampUp& r, int global_batch, std::int64_t consumed) {
  if (!r.enabled() || consumed > r.samples) return global_batch;
  const int increments = (global_batch - r.start) / r.increment;
  if (increments == 0) return global_batch;
  // (In floating point, as Megatron's samples-per-increment is.)
  const double per_increment = static_cast<double>(r.samples) / increments;
  const auto k = static_cast<std::int64_t>(static_cast<double>(consumed) / per_increment);
  return static_cast<int>(std::min<std::int64_t>(global_batch, r.start + k * r.increment));
}

int steps_for_samples(const RampUp& r, int global_batch, std::int64_t train_samples) {
  std::int64_t steps = 0, consumed = 0;
  if (r.enabled()) {
    // The ramp-up's steps (the last may pass SAMPLES, or the run's end).
    while (consumed <= r.samples && consumed <= train_samples) {
      consumed += rampup_batch(r, global_batch, consumed);
      steps++;
    }
  }
  if (train_samples > consumed) steps += (train_samples - consumed) / global_batch;
  return static_cast<int>(std::min<std::int64_t>(steps, 1 << 30));
}

BatchSchedule::BatchSchedule(const RampUp& rampup, int global_batch, int steps)
    : global_batch_(global_batch) {
  std::int64_t consumed = 0;
  consumed_.push_back(0);
  for (int k = 0; k < steps; k++) {
    const int b = rampup_batch(rampup, global_batch, consumed);
    batch_.push_back(b);
    consumed += b;
    consumed_.push_back(consumed);
    max_ = std::max(max_, b);
  }
  if (steps == 0) max_ = global_batch;
}

int BatchSchedule::global_batch(int step) const {
  if (batch_.empty()) return global_batch_;
  const int k = std::clamp(step, 1, steps()) - 1;
  return batch_[static_cast<std::size_t>(k)];
}

std::int64_t BatchSchedule::consumed_before(int step) const {
  const int k = std::clamp(step, 1, steps() + 1) - 1;
  return consumed_[static_cast<std::size_t>(k)];
}

}  // namespace troupe::model
