// The launcher's watch over a start's workers (launcher/fleet_watch.h).
#include "launcher/fleet_watch.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "launcher/exit_codes.h"

namespace troupe::launcher {

FleetWatch::FleetWatch(Fleet& fleet, actors::CoordinatorHost& coordinator, Args args)
    : fleet_(fleet), coordinator_(coordinator), args_(std::move(args)), running_(args_.world) {
  poller_ = std::thread([this] {
    while (!stop_polling_.load()) {
      poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

FleetWatch::~FleetWatch() {
  stop_polling_ = true;
  if (poller_.joinable()) poller_.join();
}

void FleetWatch::poll() {
  bool dirty = false;
  for (const FleetEvent& e : fleet_.poll()) {
    if (e.rank < 0 || e.rank >= args_.world) continue;  // (an agent's confusion)
    auto& rank_record = args_.record["ranks"][static_cast<std::size_t>(e.rank)];
    if (e.kind == FleetEvent::Kind::kStarted) {
      rank_record["pid"] = e.pid;
      dirty = true;
      continue;
    }
    rank_record["exit"] = e.what;
    dirty = true;
    if (ended_.insert(e.rank).second) running_--;
    const bool bad = e.kind == FleetEvent::Kind::kLost || !e.exit.ok();
    if (bad && e.exit.code != kExitStopped && !stopping_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      failures_.exits.emplace(e.rank, e.what);
      if (e.kind == FleetEvent::Kind::kLost) {
        failures_.lost_hosts.insert(args_.job.placement[static_cast<std::size_t>(e.rank)].host);
      }
      failures_.died = failures_.died || e.kind == FleetEvent::Kind::kLost || e.exit.signal != 0;
      if (!failures_.failed_at) failures_.failed_at = std::chrono::steady_clock::now();
    }
    if (bad && !over_.load()) {
      coordinator_.lose(
          e.rank, absl::UnavailableError(absl::StrCat(coordinator_.who(e.rank), ": ", e.what)));
    }
  }
  if (dirty) (void)write_json(args_.record_path, args_.record);
}

void FleetWatch::wait_for_exits(absl::Time until, const std::function<bool()>& interrupted) {
  while (running_.load() > 0 && absl::Now() < until && !interrupted()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void FleetWatch::stop_fleet(absl::Duration grace) {
  stop_polling_ = true;
  if (poller_.joinable()) poller_.join();
  poll();
  stopping_ = true;
  fleet_.stop(grace);
  poll();
}

FleetWatch::Failures FleetWatch::failures() {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

}  // namespace troupe::launcher
