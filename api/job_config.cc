// JobConfig::from_flags: `troupe train`'s flag table (api/train_flags.h),
// parsed from a vector and made a run as the commands make it
// (api/prepare_run.h).
#include <set>

#include "absl/strings/str_cat.h"
#include "api/prepare_run.h"
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
  absl::StatusOr<api::PreparedRun> run = api::prepare_run(f, {.runner = api::Runner::kEmbedded});
  if (!run.ok()) return run.status();
  absl::StatusOr<api::RunDevice> device = api::open_device(f);
  if (!device.ok()) return device.status();
  JobConfig c;
  c.options = std::move(run->options);
  c.parallel = f.parallel;
  c.device = std::move(device->owned);  // (null on the CPU, the process's own)
  c.parallel.device = device->device;
  c.checkpoint = f.checkpoint;
  c.trace = f.trace;
  c.stage_factory = api::stage_factory(f);
  return c;
}

}  // namespace troupe
