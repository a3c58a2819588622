// What resolve() (api/prepare_run.cc) is made of, one file per concern,
// and what those files share. Internal to troupe_api.
//   model_flags.cc      the preset and its overrides
//   precision_flags.cc  --bf16/--fp16 and the loss-scaling flags; recompute
//   length_flags.cc     the run's length (steps or samples), ramp-up, the
//                       learning-rate schedule's unit
//   recipe.cc           --recipe
//   checkpoint_flags.cc, trace_flags.cc: what finish_train_flags checks
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "api/train_flags.h"

namespace troupe::api {

// Whether the flag was on the command line (by option, or by any of its
// long names, "--seq-length").
bool given(const CLI::Option* o);
bool given(const TrainFlags& f, const std::string& name);

// --model's preset with --num-layers, --hidden-size ... over it.
absl::StatusOr<model::GptConfig> resolve_model(const TrainFlags& f);
// --recompute-*: Megatron's rules.
absl::Status resolve_recompute(const TrainFlags& f, model::ActivationOptions* a);
// --attention-kernel, or its default for f.device (flash; reference on
// cuda while !model::cuda_flash_verified()); an empty device (troupe
// launch, before its workers resolve theirs) counts as cuda where this
// host has a GPU a worker would take.
absl::Status resolve_attention(const TrainFlags& f, model::ActivationOptions* a);
// --bf16 or --fp16; the loss-scaling flags only with --fp16.
absl::Status resolve_precision(const TrainFlags& f, model::TrainOptions* o);
// --steps or --train-samples, --rampup-batch-size, the schedule's unit.
absl::Status resolve_length(const TrainFlags& f, model::TrainOptions* o);

// Makes directory `dir` (flag `flag`'s) and checks a file can be written in it.
absl::Status make_writable_dir(const std::string& dir, const char* flag);
// --trace-steps, --trace-buffer, --debug-op-cost; --trace and --flight-dir
// made absolute.
absl::Status finish_trace_flags(TrainFlags& f);

}  // namespace troupe::api
