// What the Coordinator's tests against scripted workers share.
#pragma once

#include <memory>

#include "actors/coordinator.h"
#include "model/config.h"

namespace troupe::actors::fixtures {

// One rank (tp = pp = dp = 1) of the tiny model, `steps` steps of one
// sample each; the caller adds its workers and callbacks.
inline std::shared_ptr<CoordinatorSetup> one_rank_setup(int steps) {
  auto setup = std::make_shared<CoordinatorSetup>();
  setup->options.model = *model::preset("tiny");
  setup->options.micro_batch = 1;
  setup->options.global_batch = 1;
  setup->options.steps = steps;
  setup->layout = {.tp = 1, .pp = 1, .dp = 1};
  setup->shape = {1, 1, 1, 1};
  setup->m = 1;
  setup->meta.options = setup->options;
  return setup;
}

}  // namespace troupe::actors::fixtures
