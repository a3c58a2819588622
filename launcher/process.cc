// Child processes in their own groups; see launcher/process.h.
#include "launcher/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace troupe::launcher {

std::string ExitStatus::describe() const {
  if (signal != 0) {
    const char* name = sigabbrev_np(signal);
    return absl::StrCat("killed by SIG", name != nullptr ? name : absl::StrCat(signal));
  }
  return absl::StrCat("exit code ", code);
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; e++) env.emplace_back(*e);
  return env;
}

namespace {
ExitStatus from_wait(int status) {
  if (WIFSIGNALED(status)) return {128 + WTERMSIG(status), WTERMSIG(status)};
  return {WEXITSTATUS(status), 0};
}
}  // namespace

absl::StatusOr<std::unique_ptr<Child>> Child::spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("spawn: no program");
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls (this process has other threads).
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int log_fd = -1;
  if (!spec.log_path.empty()) {
    log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(spec.log_path, ": cannot write the log: ", std::strerror(errno)));
    }
  }
  int in[2] = {-1, -1};
  if (::pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("spawn: pipe failed");
  int report[2] = {-1, -1};  // the child writes errno here if exec fails
  if (::pipe2(report, O_CLOEXEC) != 0) return absl::InternalError("spawn: pipe failed");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    if (spec.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before the prctl
    }
    ::dup2(in[0], 0);
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    // Signals the launcher's threads block must not stay blocked here.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const char* file = argv[0];
    if (std::strchr(file, '/') != nullptr) {
      ::execve(file, argv.data(), envp.data());
    } else {
      ::execvpe(file, argv.data(), envp.data());
    }
    const int err = errno;
    (void)!::write(report[1], &err, sizeof err);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with a signal to the group
  ::close(in[0]);
  ::close(report[1]);
  if (log_fd >= 0) ::close(log_fd);
  std::unique_ptr<Child> child(new Child());
  child->pid_ = pid;
  int err = 0;
  if (::read(report[0], &err, sizeof err) == static_cast<ssize_t>(sizeof err)) {
    ::close(report[0]);
    ::close(in[1]);
    child->poll();
    child->exit_ = ExitStatus{127, 0};
    return absl::NotFoundError(absl::StrCat(spec.argv[0], ": cannot run it: ", std::strerror(err)));
  }
  ::close(report[0]);
  if (!spec.stdin_data.empty()) {
    // Small (a token): fits the pipe; a child that never reads cannot block us.
    ::fcntl(in[1], F_SETFL, O_NONBLOCK);
    (void)!::write(in[1], spec.stdin_data.data(), spec.stdin_data.size());
  }
  ::close(in[1]);
  return child;
}

Child::~Child() {
  if (pid_ > 0 && !exit_) stop(absl::Seconds(2));
}

std::optional<ExitStatus> Child::poll() {
  if (exit_ || pid_ <= 0) return exit_;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_ = from_wait(status);
  return exit_;
}

std::optional<ExitStatus> Child::wait_for(absl::Duration timeout) {
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (!poll() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return exit_;
}

void Child::signal_group(int sig) {
  if (pid_ > 0) ::kill(-pid_, sig);
}

ExitStatus Child::stop(absl::Duration grace) {
  if (auto e = poll()) {
    signal_group(SIGKILL);  // what it started may still run
    return *e;
  }
  signal_group(SIGTERM);
  wait_for(grace);
  signal_group(SIGKILL);  // the group: grandchildren too, even if it exited
  if (!exit_) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    exit_ = from_wait(status);
  }
  return *exit_;
}

}  // namespace troupe::launcher
