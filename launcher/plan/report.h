// One planned layout, whole: the simulation's step, the throughput, the
// memory per GPU and whether it fits; and the search over layouts.
//
//   absl::StatusOr<plan::Plan> p = plan::make_plan(in, cluster, actors::MemoryMode::kPaper);
//   std::cout << plan::plan_json(*p).dump(2);
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/rank/memory_plan.h"
#include "launcher/plan/cost.h"
#include "launcher/plan/hardware.h"
#include "launcher/plan/sim.h"

namespace troupe::launcher::plan {

struct Plan {
  PlanInput in;
  std::string cluster;
  SimResult sim;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // Megatron's formula (see model_flops)
  std::string flops_formula;
  double peak_fraction = 0;  // of the device's dense peak at the precision
  actors::MemoryMode memory_mode = actors::MemoryMode::kPaper;
  actors::MemoryParts memory;  // the stage that needs the most
  int memory_stage = 0;
  double memory_capacity = 0;  // bytes per GPU
  bool fits = false;
  double simulate_s = 0;  // wall time of the simulation
};

// Model FLOPs of one step by Narayanan et al. 2021 (Megatron): with full
// recompute 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), else 72 B s l h^2 (1 +
// s/(6h) + V/(12 l h)); B the global batch, V the padded vocabulary.
double model_flops(const model::GptConfig& sliced, int global_batch, bool full_recompute);

// InvalidArgument for a layout that cannot run (naming the flag).
absl::Status check_layout(const PlanInput& in, const Cluster& cluster);
// The memory of the stage that needs the most (stages 0, 1 and the last
// are the only different ones unless `all_stages`).
absl::StatusOr<std::pair<actors::MemoryParts, int>> worst_memory(const PlanInput& in,
                                                                 actors::MemoryMode mode,
                                                                 bool all_stages);
absl::StatusOr<Plan> make_plan(const PlanInput& in, const Cluster& cluster, actors::MemoryMode mode,
                               bool record);

nlohmann::json plan_json(const Plan& p);
std::string plan_text(const Plan& p);

struct SearchResult {
  std::vector<Plan> best;             // fastest first, at most `top`
  std::vector<std::string> rejected;  // "tp 16 pp 5: ..." per family
  int simulated = 0;
};
// Every layout of `gpus` GPUs (tp within a node and dividing the heads, pp
// dividing the layers, micro-batch sizes 1, 2, 4 and 8 that fit the global
// batch, 1F1B, GPipe and every interleaving that fits; recompute as given,
// or every mode when `any_recompute`), ranked by step time among those
// that fit; per rejected (tp, pp) family the reason. InvalidArgument when
// `gpus` is more than the cluster has or troupe runs.
absl::StatusOr<SearchResult> search(const PlanInput& base, int gpus, const Cluster& cluster,
                                    actors::MemoryMode mode, bool any_recompute, int top);

}  // namespace troupe::launcher::plan
