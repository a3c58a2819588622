// One rank of a multi-process run, in this process (`troupe worker`): its
// RankUnit (actors/rank/rank.h) over the UCX transport, its ShardActor and
// OptimizerActor in this process's actor system, and the coordinator
// reached over the control channel (actors/runtime/coordinator_host.h) through a
// CoordinatorStandIn (actors/runtime/coordinator_stand_in.h).
//
// The rank joins with its hello (host, pid, UCX address), connects its
// transport to every peer once the coordinator has sent the addresses,
// says it is ready, and then runs until the coordinator says the run has
// ended. The rank opens the datasets itself (the filesystem is shared, as
// Megatron assumes). With save_weights, the replica-0 ranks send their
// parameter slices to rank 0 over the transport at the end, and rank 0
// writes the whole model's file (atomically).
//
// It returns OK when the run succeeded; an error when it failed anywhere
// (Aborted, with the coordinator's reason), when the coordinator is lost
// (Unavailable: no heartbeat for the channel's dead_after, or its socket
// closed) or when joining took longer than join_timeout.
//
//   absl::Status st = actors::run_worker({.spec = spec, .master_addr = "10.0.0.1",
//                                         .master_port = 29500, .token = token});
#pragma once

#include <functional>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "actors/rank/rank.h"
#include "comm/control_channel.h"

namespace troupe::actors {

// What SIGUSR1 does in a worker process: while run_worker runs, it points
// this at "write this rank's trace now" (launcher/trace_signal.h calls it).
class DumpHook {
 public:
  void set(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = std::move(fn);
  }
  void call() {
    std::lock_guard<std::mutex> lock(mu_);
    if (fn_) fn_();
  }

 private:
  std::mutex mu_;
  std::function<void()> fn_;
};

struct WorkerOptions {
  RankSpec spec;  // spec.options.model already sliced_config()
  std::string master_addr;
  int master_port = 0;
  std::string token;
  comm::ControlOptions control = {};  // heartbeats (the token is set from `token`)
  absl::Duration join_timeout = absl::Seconds(120);
  std::string save_weights = {};                          // rank 0 writes the gathered model here
  std::function<void(const std::string&)> log = nullptr;  // progress notes (stderr)
  DumpHook* dump_hook = nullptr;                          // SIGUSR1 (may be null)
  // What says every rank is on this host ("LOCAL_WORLD_SIZE=4"; empty:
  // nothing does): comm::UcxOptions::one_host.
  std::string one_host = {};
};

absl::Status run_worker(const WorkerOptions& options);

// The CAF workers a worker process runs. One: the rank's actors only react
// to messages, and with two CAF handed each message sent with no execution
// unit (anon_send: a stream's callback, the transport's, the control
// link's) to the next worker in turn, so a burst of them woke both
// (docs/ARCHITECTURE.md, "How many CAF workers"). Two where the rank's TP
// or DP collectives go through NCCL and NCCL_RUNTIME_CONNECT (the user's)
// is other than 0: a collective's first call then waits for the peers on
// its actor's worker, and the shard's and the optimizer's collectives each
// need a worker (one waiting may be what another rank's other is waiting
// for), as the process ran before it went to one.
int worker_caf_threads(bool uses_nccl, const char* nccl_runtime_connect);

// The end of a run with save_weights: replica 0's ranks send their slices
// to rank 0, which writes the file. Every rank of the job calls it.
absl::Status gather_and_save_weights(RankUnit& unit, const RankSpec& spec, const std::string& path);

}  // namespace troupe::actors
