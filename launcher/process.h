// Child processes the launcher and agents start and must never orphan:
// each in a process group of its own (so stopping it stops everything it
// started), told to die with its parent (PR_SET_PDEATHSIG: the agent or
// launcher killed with SIGKILL takes its workers along), its output in a
// log file, and secrets (the job token) on its standard input, never on
// its command line.
//
//   auto child = launcher::Child::spawn({.argv = {"troupe", "worker", ...},
//                                        .env = env, .log_path = "runs/x/rank-00003.log",
//                                        .stdin_data = token + "\n"});
//   ...
//   launcher::ExitStatus st = child->stop(absl::Seconds(3));  // TERM, then KILL the group
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace troupe::launcher {

struct ExitStatus {
  int code = 0;    // when it exited
  int signal = 0;  // when a signal ended it (then code is 128 + signal)
  bool ok() const { return code == 0 && signal == 0; }
  std::string describe() const;  // "exit code 3", "killed by SIGKILL"
};

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is the program (a path, or looked up in PATH)
  std::vector<std::string> env;   // the whole environment, "NAME=value"
  std::string log_path = {};      // stdout and stderr, appended; empty: inherited
  std::string stdin_data = {};    // written to its standard input, which is then closed
  bool die_with_parent = true;    // PR_SET_PDEATHSIG(SIGKILL)
  std::string cwd = {};           // its working directory (and of a relative log_path); empty: ours
};

class Child {
 public:
  // Starts it. PR_SET_PDEATHSIG fires when the *thread* that spawned it
  // ends: spawn from a thread that lives as long as the child should.
  static absl::StatusOr<std::unique_ptr<Child>> spawn(const ProcessSpec& spec);
  ~Child();  // stops it (and its group) if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Its exit, if it has exited (does not block). When it has, what is left
  // of its process group is killed (before it is reaped, so the group id
  // cannot have been reused).
  std::optional<ExitStatus> poll();
  // Its exit, waiting for it at most `timeout`.
  std::optional<ExitStatus> wait_for(absl::Duration timeout);
  // SIGTERM to its group, SIGKILL to the group after `grace`; reaps it (a
  // process still there 10 s after SIGKILL is reported killed, not waited for).
  ExitStatus stop(absl::Duration grace);
  void signal_group(int sig);  // nothing once it has been reaped

 private:
  Child() = default;
  pid_t pid_ = -1;
  std::optional<ExitStatus> exit_;
};

// The environment of this process, "NAME=value" each.
std::vector<std::string> current_environment();
// `env` with each of `overrides` ("NAME=value") set: replacing the variable
// of that name, or added.
std::vector<std::string> with_overrides(std::vector<std::string> env,
                                        const std::vector<std::string>& overrides);

}  // namespace troupe::launcher
