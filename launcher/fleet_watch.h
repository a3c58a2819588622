// The launcher's watch over one start's workers while the job runs: each
// worker's pid and exit go into launch.json as they come; a worker that
// fails (exits badly, is killed, or its host is lost) before the end
// ends the coordinator's run as a loss, naming it (CoordinatorHost::lose);
// and the failures that caused the end are kept for the outcome -- not a
// rank that stopped because the job did (kExitStopped), nor the launcher's
// own kills at the end.
//
//   FleetWatch watch(fleet, coordinator, {.job = job, .record = record, ...});
//   absl::Status st = coordinator.run(...);
//   watch.run_over();
//   watch.wait_for_exits(absl::Now() + absl::Seconds(10), interrupted);
//   watch.stop_fleet(absl::Seconds(3));
//   FleetWatch::Failures why = watch.failures();
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "actors/runtime/coordinator_host.h"
#include "launcher/fleet.h"
#include "launcher/launch_support.h"

namespace troupe::launcher {

class FleetWatch {
 public:
  struct Args {
    const Job& job;
    int world = 0;
    nlohmann::json& record;  // launch.json's, rewritten at record_path on each change
    std::string record_path;
  };
  // What the workers that failed by themselves did.
  struct Failures {
    std::map<int, std::string> exits;  // rank -> how it ended
    std::set<std::string> lost_hosts;
    bool died = false;  // a process was killed (or crashed) or a host lost: worth a restart
    std::optional<std::chrono::steady_clock::time_point> failed_at;  // the first one's time
  };

  // Starts polling the fleet every 50 ms on a thread of its own.
  FleetWatch(Fleet& fleet, actors::CoordinatorHost& coordinator, Args args);
  ~FleetWatch();  // stops the thread if stop_fleet() did not
  FleetWatch(const FleetWatch&) = delete;
  FleetWatch& operator=(const FleetWatch&) = delete;

  // The coordinator's run has returned: an exit no longer cancels it.
  void run_over() { over_ = true; }
  // Waits until every rank has exited or been lost (each counted once: a
  // rank on a host cut off is never heard of again), `until` passes, or
  // `interrupted()`.
  void wait_for_exits(absl::Time until, const std::function<bool()>& interrupted);
  // Stops the thread and takes the last events; then stops every worker
  // (exits from then on are the launcher's own kills) and takes theirs.
  void stop_fleet(absl::Duration grace);
  Failures failures();

 private:
  void poll();

  Fleet& fleet_;
  actors::CoordinatorHost& coordinator_;
  Args args_;
  std::mutex mu_;  // failures_
  Failures failures_;
  std::set<int> ended_;  // ranks that exited or were lost (the polling thread's, then the caller's)
  std::atomic<int> running_;
  std::atomic<bool> over_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stop_polling_{false};
  std::thread poller_;
};

}  // namespace troupe::launcher
