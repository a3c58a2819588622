// One start of a `troupe launch` job, before anything runs: each rank's
// worker command line and environment (the placement table's rows as they
// are made), and launch.json's record of them. launch_command.cc runs what
// this describes.
//
//   WorkerLaunches w = worker_launches({.f = f, .plan = plan, ...});
//   nlohmann::json record = launch_record(plan, w, "host:port", restarts);
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "launcher/fleet.h"
#include "launcher/launch_restart.h"
#include "launcher/launch_support.h"
#include "model/trainer.h"

namespace troupe::launcher {

// Where start `index` writes its flight recorder: --flight-dir (by default
// RUNDIR/flight), RUNDIR/flight.restartK for restart K (as its logs).
std::string flight_dir(const LaunchFlags& f, int index);
// Where a failure of start `index` leaves its files (--trace DIR, or the above).
std::string failure_dir(const LaunchFlags& f, int index);

struct WorkerLaunchArgs {
  const LaunchFlags& f;
  const AttemptPlan& plan;
  const model::TrainOptions& options;  // this start's, the model sliced
  const std::string& run_dir;
  const std::string& master;  // the coordinator's address and port
  int port = 0;
  std::string local_socket = {};  // its control channel's local socket, for workers on its host
};

struct WorkerLaunches {
  std::vector<WorkerLaunch> launches;                     // by rank
  std::vector<std::pair<std::string, std::string>> logs;  // (who, log file), for LogEcho
};

// Each rank's worker, placed as plan.job says; prints the placement table's
// row of each (its header is the caller's).
WorkerLaunches worker_launches(const WorkerLaunchArgs& a);

// launch.json: the command, hosts, layout, coordinator, restarts so far and
// each rank's place, log and argv (pid and exit are filled in as they come).
nlohmann::json launch_record(const AttemptPlan& plan, const WorkerLaunches& w,
                             const std::string& coordinator, const nlohmann::json& restarts);

}  // namespace troupe::launcher
