// SIGUSR1 writes the trace now: a process that gets it calls `dump` on a
// thread of its own (a signal handler can do nothing but wake it), and goes
// on running. `troupe train` writes every rank's file, a worker its own,
// `troupe launch` asks every rank to write its own.
//
//   launcher::DumpOnSignal usr1([&] { trainer->write_traces(dir, "signal"); });
#pragma once

#include <functional>
#include <thread>

namespace troupe::launcher {

class DumpOnSignal {
 public:
  // Installs the handler (one DumpOnSignal at a time in a process).
  explicit DumpOnSignal(std::function<void()> dump);
  ~DumpOnSignal();  // the handler is removed (SIGUSR1 ignored from then on)
  DumpOnSignal(const DumpOnSignal&) = delete;
  DumpOnSignal& operator=(const DumpOnSignal&) = delete;

 private:
  std::function<void()> dump_;
  int pipe_[2] = {-1, -1};
  std::thread watcher_;
};

// SIGUSR1 does nothing (rather than end the process, its default): for the
// processes of a job that have nothing to write (agents).
void ignore_dump_signal();

}  // namespace troupe::launcher
