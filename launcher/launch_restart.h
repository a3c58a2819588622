// `troupe launch --max-restarts`: what one start of a job is (its layout,
// hosts and checkpoint), how it ended, and the plan of the next start after
// a failure (launch_command.cc runs them).
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "actors/rank/rank.h"
#include "launcher/launch_support.h"
#include "model/checkpoint.h"
#include "model/trainer.h"

namespace troupe::launcher {

// One start of the job: its layout, its hosts, where it resumes from.
struct AttemptPlan {
  int index = 0;  // 0: the first start; k: the k-th restart
  actors::ParallelOptions parallel;
  Job job;
  std::string load;  // the workers' and coordinator's --load ("": none)
  bool load_optim = true;
  std::optional<std::chrono::steady_clock::time_point> failed_at;  // of the failure before it
};

struct Outcome {
  int code = 0;              // the launcher's exit status, if this start is the last
  std::string message;       // its error ("" when the run succeeded)
  bool restartable = false;  // a rank or host failed while the job ran
  std::set<std::string> lost_hosts;
  std::chrono::steady_clock::time_point failed_at;
};

// The newest checkpoint in --save when the job began, and whether the
// first start loaded it: a restart resumes only from a checkpoint of this
// job (another run's there is not its to resume).
struct RestartMemo {
  std::string save_at_start;  // checkpoint_identity() of it ("": none)
  bool started_from_save = false;
};

// A checkpoint's step and its manifest's modification time: another save
// of the same step is another checkpoint.
std::string checkpoint_identity(const model::ckpt::Checkpoint& c);

// The largest dp (at most `dp`) whose ranks fit in `slots` and whose
// micro-batches divide the global batch; 0 if none.
int largest_dp(const actors::ParallelOptions& par, const model::TrainOptions& o, int slots, int dp);

// After a failure: where the next start resumes (the newest checkpoint in
// --save, or as the first start did), and with --elastic on which hosts
// and with which dp. *resume_step: the step it resumes after (0: none).
absl::StatusOr<AttemptPlan> next_plan(const LaunchFlags& f, const model::TrainOptions& options,
                                      const RestartMemo& memo, const AttemptPlan& last,
                                      const Outcome& out, int* resume_step);

}  // namespace troupe::launcher
