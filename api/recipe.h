// Training recipes (--recipe): a published run's optimizer, schedule and
// batch, applied wherever a flag does not say otherwise.
//
//   troupe train --model mt-nlg-530b --recipe mt-nlg ...
#pragma once

#include <set>
#include <string>

#include "absl/status/status.h"
#include "api/train_flags.h"
#include "model/trainer.h"

namespace troupe::api {

// "mt-nlg" (Smith et al. 2022); InvalidArgument naming the known ones.
absl::Status check_recipe(const std::string& name);
// Applies recipe `name`'s values to `o` wherever its flag was not given
// (explicit flags win). Token counts become samples at o->model.T, so the
// model's sequence length must be final. Returns the flags it set.
std::set<std::string> apply_recipe(const std::string& name, const TrainFlags& f,
                                   model::TrainOptions* o);

// An error about a flag the recipe set (not the user) says so.
absl::Status explain_recipe(const absl::Status& st, const std::string& recipe,
                            const std::set<std::string>& recipe_set);

}  // namespace troupe::api
