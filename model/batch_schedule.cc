// Batch-size ramp-up as Megatron computes it.
#include "model/batch_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace troupe::model {
namespace {

// Megatron's samples per increment (a double, as Megatron's is); 0 when
// there is nothing to ramp.
double per_increment(const RampUp& r, int global_batch) {
  const int increments = (global_batch - r.start) / r.increment;
  return increments == 0 ? 0.0 : static_cast<double>(r.samples) / increments;
}

// The first consumed count c > `consumed` at which the ramp's batch differs
// from its batch at `consumed` (or the ramp ends: c > SAMPLES).
std::int64_t next_change(const RampUp& r, int global_batch, std::int64_t consumed) {
  const double per = per_increment(r, global_batch);
  const int batch = rampup_batch(r, global_batch, consumed);
  if (per <= 0.0 || batch == global_batch) return consumed + 1;
  const auto k = static_cast<std::int64_t>(static_cast<double>(consumed) / per);
  // About (k + 1) * per, then exact against Megatron's own expression.
  std::int64_t c = std::max<std::int64_t>(consumed + 1,
                                          static_cast<std::int64_t>(std::floor((k + 1) * per)) - 2);
  while (c <= r.samples && rampup_batch(r, global_batch, c) == batch) c++;
  return std::min(c, r.samples + 1);
}

}  // namespace

absl::Status check_rampup(const RampUp& r, int global_batch, int replica_batch) {
  if (!r.enabled()) return absl::OkStatus();
  const std::string flag =
      absl::StrCat("--rampup-batch-size ", r.start, " ", r.increment, " ", r.samples, ": ");
  if (r.start < 0 || r.increment <= 0 || r.samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "expected START, INCREMENT and SAMPLES all positive"));
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
  const double per = per_increment(r, global_batch);
  if (per <= 0.0) return global_batch;
  const auto k = static_cast<std::int64_t>(static_cast<double>(consumed) / per);
  return static_cast<int>(std::min<std::int64_t>(global_batch, r.start + k * r.increment));
}

absl::StatusOr<int> steps_for_samples(const RampUp& r, int global_batch,
                                      std::int64_t train_samples) {
  std::int64_t steps = 0, consumed = 0;
  if (r.enabled()) {
    // Megatron's loop, a batch size at a time: steps while the consumed
    // count is at most SAMPLES and the run's samples (the last may pass
    // either).
    while (consumed <= r.samples && consumed <= train_samples && steps <= kMaxSteps) {
      const std::int64_t batch = rampup_batch(r, global_batch, consumed);
      const std::int64_t until =
          std::min(next_change(r, global_batch, consumed), std::min(r.samples, train_samples) + 1);
      const std::int64_t n = std::max<std::int64_t>(1, (until - consumed + batch - 1) / batch);
      steps += n;
      consumed += n * batch;
    }
  }
  if (train_samples > consumed) steps += (train_samples - consumed) / global_batch;
  if (steps > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("--train-samples ", train_samples, ": more than ", kMaxSteps,
                     " steps; raise --global-batch-size or train fewer samples"));
  }
  return static_cast<int>(steps);
}

BatchSchedule::BatchSchedule(const RampUp& rampup, int global_batch, int steps) : steps_(steps) {
  std::int64_t consumed = 0;
  int step = 1;
  while (rampup.enabled() && step <= steps && consumed <= rampup.samples) {
    const int batch = rampup_batch(rampup, global_batch, consumed);
    if (batch == global_batch) break;
    const std::int64_t until = next_change(rampup, global_batch, consumed);
    const std::int64_t n = std::max<std::int64_t>(1, (until - consumed + batch - 1) / batch);
    segments_.push_back({step, batch, consumed});
    step += static_cast<int>(std::min<std::int64_t>(n, steps - step + 1));
    consumed += n * batch;
  }
  // The full batch, from here on (a segment even past the end, so that
  // consumed_before(steps + 1) is the run's total).
  if (!segments_.empty()) {
    const Segment& last = segments_.back();
    consumed = last.consumed + static_cast<std::int64_t>(step - last.first_step) * last.batch;
  }
  segments_.push_back({step, global_batch, consumed});
}

const BatchSchedule::Segment& BatchSchedule::segment(int step) const {
  // The last segment that starts at or before `step`.
  auto it = std::upper_bound(segments_.begin(), segments_.end(), step,
                             [](int s, const Segment& seg) { return s < seg.first_step; });
  return it == segments_.begin() ? segments_.front() : *(it - 1);
}

int BatchSchedule::global_batch(int step) const {
  if (segments_.empty()) return 0;
  return segment(std::clamp(step, 1, std::max(steps_, 1))).batch;
}

std::int64_t BatchSchedule::consumed_before(int step) const {
  if (segments_.empty()) return 0;
  const int s = std::clamp(step, 1, steps_ + 1);
  const Segment& seg = segment(s);
  return seg.consumed + static_cast<std::int64_t>(s - seg.first_step) * seg.batch;
}

}  // namespace troupe::model
