// The worker processes of a `troupe launch` job, however they are started:
// as children of the launcher (one host, no ssh), or by one `troupe agent`
// per host (launcher/agent.h), each started through the --rsh template
// (`ssh -o BatchMode=yes {host}`, `ip netns exec {host}`, `srun -N1 -n1 -w
// {host}`). Either way the launcher hears the same events: a worker has
// started (its pid), has exited (its status), or cannot be reached (an agent
// lost: its workers die with it, by PR_SET_PDEATHSIG).
//
//   auto fleet = launcher::local_fleet(token);
//   RETURN_IF_ERROR(fleet->start(workers));
//   for (const FleetEvent& e : fleet->poll()) ...
//   fleet->stop(absl::Seconds(3));   // every worker (and agent) stopped and reaped
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/hostfile.h"
#include "launcher/process.h"

namespace troupe::launcher {

struct WorkerLaunch {
  int rank = 0;
  std::string host;
  std::vector<std::string> argv = {};
  std::vector<std::string> env =
      {};                // set over the host's environment (the launcher's, or the agent's)
  std::string cwd = {};  // its working directory
  std::string log = {};  // its output, appended
};

struct FleetEvent {
  enum class Kind { kStarted, kExited, kLost };
  Kind kind = Kind::kStarted;
  int rank = 0;
  int pid = 0;            // kStarted
  ExitStatus exit = {};   // kExited
  std::string what = {};  // kExited: exit.describe(); kLost: why
};

class Fleet {
 public:
  virtual ~Fleet() = default;
  virtual absl::Status start(const std::vector<WorkerLaunch>& workers) = 0;
  // What happened since the last call (never blocks).
  virtual std::vector<FleetEvent> poll() = 0;
  // TERM to every worker, KILL after `grace`; returns when all are reaped.
  virtual void stop(absl::Duration grace) = 0;
  // Where the agents connect (0: no agents).
  virtual int port() const { return 0; }
};

// Workers as children of this process (the token on their stdin).
std::unique_ptr<Fleet> local_fleet(const std::string& token);

struct AgentFleetOptions {
  std::vector<std::string> hosts;  // one agent each, in this order
  std::string rsh;                 // the template, "{host}" replaced
  std::string self;                // this program, as the hosts can run it
  std::string master_addr;         // where the agents reach this launcher
  std::string token;
  std::string log_dir;  // agent-<host>.log here
  absl::Duration join_timeout = absl::Seconds(60);
  std::function<bool()> interrupted = nullptr;  // stops waiting for the agents when true
  // --exit-signal-handler: the agents outlive a SIGTERM (SLURM's, to every
  // process of the job) so that the run can save and end.
  bool survive_sigterm = false;
};
// Starts the agents and waits until every one has connected.
absl::StatusOr<std::unique_ptr<Fleet>> agent_fleet(const AgentFleetOptions& options);

// `template` with {host} replaced, split on whitespace (no shell).
std::vector<std::string> rsh_argv(const std::string& tmpl, const std::string& host);

}  // namespace troupe::launcher
