// `troupe agent`: the launcher's hands on one host. It connects to the
// launcher over the control channel (the job token first), starts the
// workers it is told to start (each in its own process group, dying with
// the agent, the token on its stdin), reports each one's pid and exit, and
// stops them all -- TERM, then KILL to each group -- when told to, or when
// the launcher is gone (its connection closed or silent: a launcher killed
// with SIGKILL leaves no worker behind).
//
// Messages are JSON, one per control frame:
//   launcher -> agent  {"type":"start","workers":[{"rank":3,"argv":[...],"env":[...],"log":"...",
//                                                  "cwd":"..."}]}
//                      (env: set over the agent's own environment; cwd: where
//                      the worker runs, the launcher's directory)
//                      {"type":"stop","grace_ms":3000}
//   agent -> launcher  {"type":"started","rank":3,"pid":1234}
//                      {"type":"exited","rank":3,"code":0,"signal":0,"status":"exit code 0"}
//                      {"type":"error","rank":3,"message":"..."}
//
//   return launcher::run_agent({.master_addr = a, .master_port = p, .index = i, .token = t});
#pragma once

#include <string>

#include "absl/time/time.h"
#include "comm/control_channel.h"

namespace troupe::launcher {

struct AgentOptions {
  std::string master_addr;
  int master_port = 0;
  int index = 0;  // which host of the job (its hello to the launcher)
  std::string token;
  comm::ControlOptions control = {};  // heartbeats (the token is set from `token`)
  absl::Duration stop_grace = absl::Seconds(3);
  // SIGTERM is noted and otherwise ignored (the job's --exit-signal-handler:
  // the launcher ends the run after a checkpoint, then stops the agent).
  bool survive_sigterm = false;
};

// Runs until told to stop (0) or until the launcher is lost (1); every
// worker is stopped before it returns. Messages go to standard error.
int run_agent(const AgentOptions& options);

}  // namespace troupe::launcher
