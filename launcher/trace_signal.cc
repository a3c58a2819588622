// SIGUSR1: write the trace now (launcher/trace_signal.h).
#include "launcher/trace_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace troupe::launcher {
namespace {

std::atomic<int> wake_fd{-1};

void on_usr1(int) {
  const int saved = errno;
  const int fd = wake_fd.load();
  if (fd >= 0) {
    const char b = 'd';
    (void)!write(fd, &b, 1);  // a full pipe already holds a wake-up
  }
  errno = saved;
}

}  // namespace

DumpOnSignal::DumpOnSignal(std::function<void()> dump) : dump_(std::move(dump)) {
  if (pipe2(pipe_, O_CLOEXEC) != 0) return;  // no pipe: SIGUSR1 keeps its default
  fcntl(pipe_[1], F_SETFL, O_NONBLOCK);
  wake_fd.store(pipe_[1]);
  watcher_ = std::thread([this] {
    char b[64];
    for (;;) {
      const ssize_t n = read(pipe_[0], b, sizeof(b));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the write end closed: stop
      bool stop = false;
      for (ssize_t i = 0; i < n; i++) stop = stop || b[i] == 'q';
      if (stop) return;
      dump_();
    }
  });
  struct sigaction sa = {};
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
}

DumpOnSignal::~DumpOnSignal() {
  ignore_dump_signal();
  wake_fd.store(-1);
  if (watcher_.joinable()) {
    const char q = 'q';
    (void)!write(pipe_[1], &q, 1);
    watcher_.join();
  }
  for (int fd : pipe_) {
    if (fd >= 0) close(fd);
  }
}

void ignore_dump_signal() {
  struct sigaction sa = {};
  sa.sa_handler = SIG_IGN;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace troupe::launcher
