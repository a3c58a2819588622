#include "api/prepare_run.h"

#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"
#include "api/print_config.h"
#include "api/recipe.h"

namespace troupe::api {

absl::StatusOr<model::TrainOptions> resolve(const TrainFlags& f,
                                            std::set<std::string>* recipe_set) {
  absl::StatusOr<model::GptConfig> config = resolve_model(f);
  if (!config.ok()) return config.status();
  if (absl::Status st = check_recipe(f.recipe); !st.ok()) return st;
  if (!f.recipe.empty() && given(f.steps_flag)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recipe ", f.recipe,
                     " schedules by samples (its batch ramp-up, warm-up and decay are "
                     "in tokens): give the run's length with --train-samples, not --steps"));
  }
  model::TrainOptions o = f.options;
  o.model = *config;
  const std::set<std::string> set = apply_recipe(f.recipe, f, &o);
  if (recipe_set != nullptr) *recipe_set = set;
  if (absl::Status st = resolve_recompute(f, &o.activations); !st.ok()) return st;
  if (absl::Status st = resolve_precision(f, &o); !st.ok()) return st;
  if (absl::Status st = resolve_attention(f, &o.activations); !st.ok()) return st;
  if (o.global_batch == 0) o.global_batch = o.micro_batch;
  if (absl::Status st = resolve_length(f, &o); !st.ok()) return st;
  if (o.eval_interval > 0 && o.eval_iters == 0) o.eval_iters = 10;  // Megatron's default is 100
  absl::Status st = o.validate();
  if (!st.ok()) return st;
  return o;
}

absl::StatusOr<PreparedRun> prepare_run(TrainFlags& f, const RunRequest& request) {
  const Runner runner = request.runner;
  const bool process_per_rank = runner == Runner::kLaunch || runner == Runner::kWorker;
  const bool commits = runner == Runner::kTrain || runner == Runner::kLaunch;
  if (absl::Status st = finish_train_flags(f); !st.ok()) return st;
  PreparedRun run;
  if (runner != Runner::kLaunch) {  // (launch: once it has placed its workers)
    run.device_why = resolve_device(f, process_per_rank, request.workers_here);
  }
  if (absl::Status st = check_device(f, process_per_rank); !st.ok()) return st;
  if (f.print_config && runner == Runner::kWorker) {
    return absl::InvalidArgumentError(
        "--print-config: ask troupe train or troupe launch, not a worker");
  }
  absl::StatusOr<model::TrainOptions> options = resolve(f, &run.recipe_set);
  if (!options.ok()) return options.status();
  run.options = *std::move(options);
  if (f.print_config) {
    if (absl::Status st = print_config(f, run.options, run.recipe_set); !st.ok()) return st;
    run.printed = true;
    return run;
  }
  if (absl::Status st = f.parallel.validate(run.options); !st.ok()) {
    return explain_recipe(st, f.recipe, run.recipe_set);
  }
  if (commits && !f.save_weights.empty()) {  // (not a worker's: as before)
    if (absl::Status st = check_writable(f.save_weights, "--save-weights"); !st.ok()) return st;
  }
  if (runner == Runner::kTrain || runner == Runner::kWorker) {
    absl::StatusOr<std::optional<model::ckpt::Checkpoint>> load = open_load(f, run.options);
    if (!load.ok()) return load.status();
    run.load = *std::move(load);
  }
  if (commits && !f.checkpoint.save.empty()) {  // (last: a run that goes no further locks nothing)
    if (absl::Status st = model::ckpt::lock_save_dir(f.checkpoint.save); !st.ok()) return st;
  }
  return run;
}

}  // namespace troupe::api
