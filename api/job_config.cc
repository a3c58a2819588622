// JobConfig::from_flags: `troupe train`'s flag table (api/train_flags.h),
// parsed from a vector and resolved as the command resolves it.
#include <set>

#include "absl/strings/str_cat.h"
#include "api/train_config.h"
#include "api/train_flags.h"
#include "troupe/troupe.h"

namespace troupe {

absl::StatusOr<JobConfig> JobConfig::from_flags(const std::vector<std::string>& args) {
  api::TrainFlags f;
  CLI::App app("troupe job", "job");
  add_train_flags(&app, f);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // (CLI11 takes them so)
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(absl::StrCat("JobConfig::from_flags: ", e.what()));
  }
  for (const char* cli_only : {"--print-config", "--metrics-jsonl", "--save-weights",
                               "--log-interval", "--exit-signal-handler"}) {
    if (app.count(cli_only) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(cli_only,
                       " is troupe train's own: an embedded job sends its metrics to "
                       "its subscribers and stops on stop_atom"));
    }
  }
  if (absl::Status st = api::finish_train_flags(f); !st.ok()) return st;
  (void)api::resolve_device(f, /*process_per_rank=*/false);
  absl::StatusOr<api::RunDevice> device = api::open_device(f);
  if (!device.ok()) return device.status();
  std::set<std::string> recipe_set;
  absl::StatusOr<model::TrainOptions> o = api::resolve(f, &recipe_set);
  if (!o.ok()) return o.status();
  if (absl::Status st = f.parallel.validate(*o); !st.ok()) {
    return api::explain_recipe(st, f.recipe, recipe_set);
  }
  JobConfig c;
  c.options = *std::move(o);
  c.parallel = f.parallel;
  c.device = std::move(device->owned);  // (null on the CPU, the process's own)
  c.parallel.device = device->device;
  c.checkpoint = f.checkpoint;
  c.trace = f.trace;
  c.stage_factory = api::stage_factory(f);
  return c;
}

}  // namespace troupe
