// The global batch of every step, with Megatron's batch-size ramp-up
// (--rampup-batch-size START INCREMENT SAMPLES), and the samples consumed
// before each step: what every rank's data order, loss weights and
// sample-based learning rate follow.
//
// Megatron (RampupBatchsizeNumMicroBatchesCalculator): the batch starts at
// START and grows by INCREMENT every SAMPLES / ((GBS - START) / INCREMENT)
// samples consumed, until SAMPLES have been consumed; then it is GBS. A run
// of --train-samples N takes the ramp-up's steps and then N minus what they
// consumed in whole global batches (Megatron's update_train_iters).
//
// The schedule is a few segments (one per batch size of the ramp, then the
// full batch), so a run of a billion steps costs no memory per step.
//
//   absl::StatusOr<model::BatchSchedule> b = model::BatchSchedule::make(ramp, 1920, steps);
//   int gbs = b->global_batch(step);            // 1-based
//   std::int64_t first = b->consumed_before(step);
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::model {

struct RampUp {
  int start = 0;  // 0: no ramp-up
  int increment = 0;
  std::int64_t samples = 0;
  bool enabled() const { return start > 0; }
};

// Steps a run may have (the step counters are int).
inline constexpr std::int64_t kMaxSteps = (std::int64_t{1} << 30) - 1;

// InvalidArgument naming --rampup-batch-size when the ramp does not fit
// --global-batch-size or replicas of `replica_batch` sequences (the
// micro-batch times dp) each: START, INCREMENT and SAMPLES positive, START
// and INCREMENT multiples of replica_batch, START <= GBS, GBS - START a
// multiple of INCREMENT.
absl::Status check_rampup(const RampUp& r, int global_batch, int replica_batch);

// Megatron's ramp-up batch after `consumed` samples (a checked ramp).
int rampup_batch(const RampUp& r, int global_batch, std::int64_t consumed);

// The number of steps of a run of `train_samples` samples; InvalidArgument
// naming --train-samples past kMaxSteps.
absl::StatusOr<int> steps_for_samples(const RampUp& r, int global_batch,
                                      std::int64_t train_samples);

class BatchSchedule {
 public:
  BatchSchedule() = default;  // no steps: global_batch() is 0
  // `steps` steps of `global_batch`, ramped up by a checked `rampup`.
  BatchSchedule(const RampUp& rampup, int global_batch, int steps);

  int steps() const { return steps_; }
  // Step `step` (1-based; past the end, the last batch).
  int global_batch(int step) const;
  // Samples of the steps before `step` (step = steps() + 1: the whole run).
  std::int64_t consumed_before(int step) const;

 private:
  // Steps [first_step, next segment's) have `batch` sequences each, the
  // first of them after `consumed` samples.
  struct Segment {
    int first_step;
    int batch;
    std::int64_t consumed;
  };
  const Segment& segment(int step) const;

  std::vector<Segment> segments_;
  int steps_ = 0;
};

}  // namespace troupe::model
