// The coordinator of a run whose ranks are other processes (`troupe
// launch`, or rank 0's process under mpirun/srun/torchrun): it listens on
// the control channel, lets every rank join (the job token first, then its
// hello: host, pid, transport address), tells every rank the others'
// transport addresses, waits until each says its actors are up, then runs
// the same Coordinator actor as one process does, talking to RemoteActor
// stand-ins (actors/runtime/remote.h). When the run ends -- the last step, a
// failure, a lost rank or cancel() -- every rank is told (end), and run()
// returns the run's status.
//
// A rank that is lost (its process died: at once; hung or cut off: after
// the channel's dead_after) ends the run with an error naming it, its
// (d, s, t), host and pid. Nothing here waits without a bound: joining and
// getting ready are bounded by join_timeout.
//
// Watchers (`troupe watch`, troupe::JobWatcher) join the same channel with
// the token and get the run's events (actors/runtime/watch_feed.h); they never
// count as ranks, and their coming and going never touches the run.
//
//   auto host = actors::CoordinatorHost::listen({.options = o, .parallel = par, .token = t});
//   ... start the workers with (*host)->port() ...
//   absl::Status st = (*host)->run(on_step);
#pragma once

#include <caf/all.hpp>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "actors/rank/rank.h"
#include "actors/runtime/remote.h"
#include "actors/runtime/remote_actor.h"
#include "actors/runtime/watch_feed.h"
#include "comm/control_channel.h"
#include "model/trainer.h"

namespace troupe::actors {

struct CoordinatorHostOptions {
  model::TrainOptions options;  // options.model already sliced_config()
  ParallelOptions parallel;
  std::string listen_host = "0.0.0.0";
  int port = 0;  // 0: any free port
  std::string token;
  comm::ControlOptions control = {};  // heartbeats (the token is set from `token`)
  absl::Duration join_timeout = absl::Seconds(120);
  std::function<void(const std::string&)> log = nullptr;  // refusals, late losses (stderr)
  RunCheckpoints checkpoints = {};  // --save/--load (the ranks load their own parts)
  // How long a run that a rank's failure report ended waits for another
  // rank's loss, which may be its cause (CoordinatorHost::end; the
  // launcher polls its workers every 50 ms).
  absl::Duration blame_grace = absl::Milliseconds(300);
};

class CoordinatorHost {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorHost>> listen(CoordinatorHostOptions options);
  ~CoordinatorHost();
  int port() const { return hub_->port(); }
  // The control channel's local socket (comm/control_channel.h), for the
  // workers started on this host: `troupe worker --control-socket`.
  const std::string& local_name() const { return hub_->local_name(); }
  int refused_connections() const { return hub_->refused_connections(); }

  struct Member {
    bool joined = false;
    bool ready = false;  // its actors are up
    bool done = false;   // after the end: it has stopped (or is lost)
    RankHello hello;
  };
  // Every rank's hello so far (by rank).
  std::vector<Member> members() const;
  // Called once, when every rank has joined (before the run begins).
  using OnJoined = std::function<void(const std::vector<Member>&)>;
  absl::Status run(const std::function<void(const model::StepMetrics&)>& on_step,
                   const OnJoined& on_joined = nullptr);
  // Ends the run (from any thread, e.g. a signal's): run() returns `why`
  // (if the run had not ended already), without waiting for the ranks'
  // goodbyes.
  void cancel(absl::Status why);
  // The same for `rank`, whose process is gone (the launcher saw it exit):
  // the run's cause, even where another rank's report of what it saw came
  // first.
  void lose(int rank, absl::Status why);
  // Every rank writes its trace now (SIGUSR1 of the launcher), with `reason`.
  void request_traces(const std::string& reason);
  // "rank 3 (d=1 s=1 t=0) on host h2, pid 1234".
  std::string who(int rank) const;
  // A line for the watchers (`troupe watch`: actors/runtime/watch_feed.h), e.g. a
  // warning of the launcher's; the coordinator's own lines, every step's
  // metrics, checkpoints and the end reach them without this.
  void publish_log(const std::string& line);
  int watchers() const { return feed_ ? feed_->watchers() : 0; }

 private:
  explicit CoordinatorHost(CoordinatorHostOptions options);
  bool on_join(int rank, const std::string& hello);
  void on_frame(int rank, std::string frame);
  void on_lost(int rank, absl::Status why);
  // The first one wins, but the loss of `lost` (a rank), heard within
  // options_.blame_grace of another rank's failure report, is named as the
  // cause before it (the report may be second-hand: a read from the lost
  // rank failed). A rank's own exit after its report does not replace it.
  void end(absl::Status st, int lost = -1);
  void blame_locked(int lost, absl::Status loss);
  void end_run(absl::Status why, int lost);  // cancel() and lose()
  // Waits (bounded by join_timeout) until `count` of world_ ranks have
  // done `what`, or the run has ended; false if it has ended (then the
  // outcome says why, also when the time ran out).
  bool wait_for_all(const int& count, bool Member::*done, const char* what);
  void broadcast(const Envelope& e);
  absl::Status run_coordinator(const std::function<void(const model::StepMetrics&)>& on_step);
  // Whether a rank may send this message to the coordinator (its own rank
  // in it, its own replica's micro-batches): anything else cuts it off.
  bool allowed(int rank, const Envelope& e) const;
  void finish_ranks(const absl::Status& st);

  CoordinatorHostOptions options_;
  int world_ = 1;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::unique_ptr<comm::ControlHub> hub_;
  std::unique_ptr<WatchFeed> feed_;  // (before the hub goes)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Member> members_;
  int joined_ = 0, ready_ = 0, done_ = 0;
  bool aborted_ = false;
  bool running_ = false;              // stand-ins exist (frames for the coordinator are delivered)
  bool coordinator_started_ = false;  // (mu_ or the run's thread before it ends)
  std::optional<absl::Status> outcome_;
  bool settled_ = false;  // the outcome is told to the ranks: no loss replaces it
  caf::actor coordinator_;
  std::vector<caf::actor> shards_, optimizers_;  // stand-ins, by rank
};

}  // namespace troupe::actors
