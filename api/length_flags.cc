// The run's length and the data it takes: --steps (--train-iters) or
// --train-samples, --rampup-batch-size, and the learning-rate schedule's
// unit (iterations or samples).
#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"

namespace troupe::api {

// The run's length in steps or (--train-samples) samples, the ramp-up and
// the learning-rate schedule's unit, by Megatron's rules: a ramp-up and the
// sample-based schedule need --train-samples, which excludes the
// iteration-based flags.
absl::Status resolve_length(const TrainFlags& f, model::TrainOptions* o) {
  if (!f.rampup.empty()) {
    if (f.rampup.size() != 3 || f.rampup[0] > (1 << 30) || f.rampup[1] > (1 << 30)) {
      return absl::InvalidArgumentError(
          "--rampup-batch-size: expected START INCREMENT SAMPLES (e.g. 32 32 6000000)");
    }
    o->rampup = {.start = static_cast<int>(f.rampup[0]),
                 .increment = static_cast<int>(f.rampup[1]),
                 .samples = f.rampup[2]};
    if (o->rampup.start <= 0) {
      return absl::InvalidArgumentError("--rampup-batch-size: START must be positive");
    }
  }
  if (o->train_samples > 0) {
    if (given(f.steps_flag)) {
      return absl::InvalidArgumentError(
          "--train-samples and --steps (--train-iters) both set the run's length: give one");
    }
    if (given(f.warmup_iters_flag) || given(f.decay_iters_flag)) {
      return absl::InvalidArgumentError(
          "--train-samples counts the learning-rate schedule in samples: use "
          "--lr-warmup-samples and --lr-decay-samples, not --lr-warmup-iters or "
          "--lr-decay-iters");
    }
    if (absl::Status st = model::check_rampup(o->rampup, o->global_batch, o->micro_batch);
        !st.ok()) {
      return st;
    }
    absl::StatusOr<int> steps =
        model::steps_for_samples(o->rampup, o->global_batch, o->train_samples);
    if (!steps.ok()) return steps.status();
    o->steps = *steps;
    if (o->lr.decay_samples == 0) o->lr.decay_samples = o->train_samples;
    return absl::OkStatus();
  }
  if (o->train_samples < 0) return absl::InvalidArgumentError("--train-samples must be positive");
  if (o->rampup.enabled()) {
    return absl::InvalidArgumentError(
        "--rampup-batch-size needs --train-samples (a ramp-up counts samples; Megatron's rule)");
  }
  if (o->lr.warmup_samples > 0 || o->lr.decay_samples > 0) {
    return absl::InvalidArgumentError(
        "--lr-warmup-samples and --lr-decay-samples need --train-samples");
  }
  if (o->lr.decay_iters == 0) o->lr.decay_iters = o->steps;
  return absl::OkStatus();
}

}  // namespace troupe::api
