// The plan of the next start of a job after a failure.
#include "launcher/launch_restart.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace troupe::launcher {

std::string checkpoint_identity(const model::ckpt::Checkpoint& c) {
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(c.dir() + "/manifest.json", ec);
  return absl::StrCat(c.meta().step, "@", ec ? 0 : t.time_since_epoch().count());
}

int largest_dp(const actors::ParallelOptions& par, const model::TrainOptions& o, int slots,
               int dp) {
  for (int d = std::min(dp, slots / (par.tp * par.pp)); d >= 1; d--) {
    actors::ParallelOptions p = par;
    p.dp = d;
    if (p.validate(o).ok()) return d;
  }
  return 0;
}

absl::StatusOr<AttemptPlan> next_plan(const LaunchFlags& f, const model::TrainOptions& options,
                                      const RestartMemo& memo, const AttemptPlan& last,
                                      const Outcome& out, int* resume_step) {
  AttemptPlan next = last;
  next.index = last.index + 1;
  next.failed_at = out.failed_at;
  *resume_step = 0;
  const std::string& save = f.train.checkpoint.save;
  absl::StatusOr<model::ckpt::Checkpoint> newest = model::ckpt::Checkpoint::open(save);
  if (!newest.ok() && !absl::IsNotFound(newest.status())) {
    return absl::Status(newest.status().code(),
                        absl::StrCat("--save's newest checkpoint: ", newest.status().message()));
  }
  // (Another run's checkpoint in --save, there before this job began and
  // not what it started from, is not this job's to resume.)
  if (newest.ok() && checkpoint_identity(*newest) == memo.save_at_start &&
      !memo.started_from_save) {
    newest = absl::NotFoundError("not this job's");
  }
  if (newest.ok()) {
    next.load = save;
    next.load_optim = true;
    *resume_step = newest->meta().step;
  } else {
    next.load = f.train.checkpoint.load;
    next.load_optim = f.train.checkpoint.load_optim;
    if (!next.load.empty() && next.load_optim) {
      absl::StatusOr<model::ckpt::Checkpoint> first = model::ckpt::Checkpoint::open(next.load);
      if (first.ok()) *resume_step = first->meta().step;
    }
  }
  if (f.elastic && !out.lost_hosts.empty()) {
    std::vector<HostSlots> slots;
    int total = 0;
    for (const HostSlots& h : last.job.slots) {
      if (out.lost_hosts.count(h.host) > 0) continue;
      slots.push_back(h);
      total += static_cast<int>(h.slots.size());
    }
    const int dp = largest_dp(last.parallel, options, total, f.train.parallel.dp);
    if (dp == 0) {
      return absl::UnavailableError(
          absl::StrCat("--elastic: the ", total,
                       " slots left on the reachable hosts fit no data-parallel size "
                       "of --tp ",
                       last.parallel.tp, " x --pp ", last.parallel.pp));
    }
    next.parallel.dp = dp;
    absl::StatusOr<Job> job = place_on(std::move(slots), next.parallel.world(), last.job.local);
    if (!job.ok()) return job.status();
    next.job = *std::move(job);
  }
  return next;
}

}  // namespace troupe::launcher
