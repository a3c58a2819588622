// What `troupe watch` (and troupe::JobWatcher) hears from a running
// `troupe launch` job: the coordinator host accepts watchers on its control
// channel (the job token first, as every rank; then a hello with an id at
// or above kWatcherBase and kWatchHello) and sends each one JSON frames:
// a hello (the run's length, the step it is at, its layout and model), then
// every step's metrics, the coordinator's lines (saves, stops, warnings),
// each committed checkpoint and the end. Watchers only listen: one that
// sends anything is cut off, and a slow, leaving or dead one never holds
// the run (a WatchFeed thread writes to them, not the coordinator's).
//
//   WatchFeed feed;
//   feed.start(hub);                   // hub outlives it
//   feed.add(id, encode_watch_event({.kind = WatchEvent::Kind::kHello, ...}));
//   feed.publish({.kind = WatchEvent::Kind::kStep, .metrics = m});
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "comm/control_channel.h"
#include "model/trainer.h"

namespace troupe::actors {

// Control-channel ids of watchers (ranks are below it).
constexpr int kWatcherBase = 1 << 30;
constexpr char kWatchHello[] = "troupe-watch/1";

struct WatchEvent {
  enum class Kind { kHello, kStep, kLog, kCheckpoint, kEnd };
  Kind kind = Kind::kLog;
  int steps = 0;               // hello: the run's length
  int step = 0;                // hello: steps done; checkpoint: its step
  std::string layout;          // hello
  std::string model;           // hello
  model::StepMetrics metrics;  // step
  std::string text;      // log: the line; checkpoint: its directory; end: the error ("" if OK)
  bool stalled = false;  // end: the run made no progress (the error is the stall report)
};

std::string encode_watch_event(const WatchEvent& e);
// DataLoss naming what is wrong for a frame that is not one.
absl::StatusOr<WatchEvent> decode_watch_event(const std::string& frame);

class WatchFeed {
 public:
  WatchFeed();
  ~WatchFeed();  // close()
  // Sends what is queued (for at most 2 s), then sends nothing more (what
  // is added or published after it stays queued).
  void close();
  // Nothing is sent before the hub is known (it may take a watcher before
  // its maker has it); `hub` outlives the feed.
  void start(comm::ControlHub* hub);
  // A watcher has joined (on the hub's thread): its hello, made from the
  // last step published (or set_step's), goes first, then every frame
  // published after it -- so the watcher's steps follow its hello's, none
  // missed or twice. False (nothing added) when kMaxWatchers watch already.
  bool add(int id, const std::function<std::string(int step)>& hello);
  // The step a run resumes after (before any is published).
  void set_step(int step);
  void remove(int id);
  // Queued for every watcher (at most kMaxQueued frames wait; older ones
  // are dropped for a watcher too slow to keep up).
  void publish(const WatchEvent& e);
  int watchers() const;

 private:
  static constexpr std::size_t kMaxQueued = 4096;
  static constexpr std::size_t kMaxWatchers = 64;
  void loop();

  struct Out {
    int to;  // a watcher, or -1: every watcher that joined before it
    std::uint64_t seq;
    std::string frame;
  };
  comm::ControlHub* hub_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Out> queue_;
  std::uint64_t seq_ = 0;
  int step_ = 0;                      // the last step published
  std::map<int, std::uint64_t> ids_;  // watcher -> the seq it joined at
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace troupe::actors
