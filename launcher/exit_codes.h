// The exit codes of troupe's processes, named once: a worker sets them and
// the launcher (and its agents) read them, so both sides include this.
//
//   if (st.IsAborted()) return kExitStopped;           // worker_command.cc
//   if (e.exit.code != kExitStopped) ...                // launch_command.cc: a cause
#pragma once

namespace troupe::launcher {

// 0: the run succeeded.
inline constexpr int kExitOk = 0;
// 1: this process failed (bad input, a rank's own failure, a lost
// coordinator); its stderr says why.
inline constexpr int kExitFailed = 1;
// 2: the command line named no subcommand.
inline constexpr int kExitUsage = 2;
// 3: a worker stopped because the job did (another rank's failure, or an
// interrupt): not a cause of the failure, which the launcher reports from
// the rank that was one.
inline constexpr int kExitStopped = 3;
// 128 + N: ended by signal N (the shell's convention), for a process and
// for the launcher interrupted by SIGINT or SIGTERM.
inline constexpr int exit_for_signal(int signal) { return 128 + signal; }

}  // namespace troupe::launcher
