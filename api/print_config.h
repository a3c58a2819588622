// --print-config: the resolved configuration of a run, every value with
// where it came from, and what the run would hold in memory, without
// training.
//
//   troupe train --model gpt2-124m --recipe mt-nlg --tp 2 --micro-batch-size 8 --print-config
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "api/train_flags.h"
#include "model/trainer.h"

namespace troupe::api {

// One line of --print-config.
struct ConfigValue {
  std::string flag;  // Megatron's name
  std::string value;
  std::string source;  // default, preset NAME, recipe NAME, flag, derived
};
// The resolved options as --print-config lists them (`recipe_set`: what
// apply_recipe set).
std::vector<ConfigValue> describe_config(const TrainFlags& f, const model::TrainOptions& o,
                                         const std::set<std::string>& recipe_set);

// Prints the configuration and, per pipeline stage, the memory a rank of it
// holds: counted (what troupe allocates, fp32) and Korthikanti et al.'s
// 16-bit estimate (actors/rank/memory_plan.h). A layout the runtime cannot run
// is printed too, then the error (the memory needs a runnable layout).
absl::Status print_config(const TrainFlags& f, const model::TrainOptions& o,
                          const std::set<std::string>& recipe_set);

}  // namespace troupe::api
