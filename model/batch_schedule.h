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
//   model::BatchSchedule b(options);           // validated options
//   int gbs = b.global_batch(step);            // 1-based
//   std::int64_t first = b.consumed_before(step);
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace troupe::model {

struct RampUp {
  int start = 0;  // 0: no ramp-up
  int increment = 0;
  std::int64_t samples = 0;
  bool enabled() const { return start > 0; }
};

// InvalidArgument naming --rampup-batch-size when the ramp does not fit
// --global-batch-size or replicas of `replica_batch` sequences (the
// micro-batch times dp) each: START and INCREMENT multiples of it, START <=
// GBS, GBS - START a multiple of INCREMENT.
absl::Status check_rampup(const RampUp& r, int global_batch, int replica_batch);

// Megatron's ramp-up batch after `consumed` samples.
int rampup_batch(const RampUp& r, int global_batch, std::int64_t consumed);

// The number of steps of a run of `train_samples` samples.
int steps_for_samples(const RampUp& r, int global_batch, std::int64_t train_samples);

class BatchSchedule {
 public:
  BatchSchedule() = default;
  // `steps` steps of `global_batch`, ramped up by `rampup`.
  BatchSchedule(const RampUp& rampup, int global_batch, int steps);

  int steps() const { return static_cast<int>(batch_.size()); }
  // Step `step` (1-based; past the end, the last batch).
  int global_batch(int step) const;
  // Samples of the steps before `step` (step = steps() + 1: the whole run).
  std::int64_t consumed_before(int step) const;
  int max_global_batch() const { return max_; }

 private:
  std::vector<int> batch_;              // by step - 1
  std::vector<std::int64_t> consumed_;  // before each step, and the total
  int max_ = 0, global_batch_ = 0;
};

}  // namespace troupe::model
