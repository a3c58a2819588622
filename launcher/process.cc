// Child processes in their own groups; see launcher/process.h.
#include "launcher/process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <thread>

#include "absl/strings/str_cat.h"
#include "launcher/exit_codes.h"

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

std::vector<std::string> with_overrides(std::vector<std::string> env,
                                        const std::vector<std::string>& overrides) {
  for (const std::string& kv : overrides) {
    const std::string name = kv.substr(0, kv.find('=') + 1);  // "NAME="
    std::erase_if(env, [&](const std::string& e) { return e.compare(0, name.size(), name) == 0; });
    env.push_back(kv);
  }
  return env;
}

namespace {
ExitStatus from_wait(int status) {
  if (WIFSIGNALED(status)) return {exit_for_signal(WTERMSIG(status)), WTERMSIG(status)};
  return {WEXITSTATUS(status), 0};
}
}  // namespace

namespace {

// argv[0] as exec should find it: a path as it is, else the first match in
// the PATH of the child's environment (execvpe would search ours).
std::string resolve_program(const std::string& name, const std::vector<std::string>& env) {
  if (name.find('/') != std::string::npos) return name;
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& e : env)
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  for (std::size_t b = 0; b <= path.size();) {
    std::size_t e = path.find(':', b);
    if (e == std::string::npos) e = path.size();
    const std::string dir = e > b ? path.substr(b, e - b) : ".";
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    b = e + 1;
  }
  return name;  // exec fails and says so
}

void close_all(std::initializer_list<int> fds) {
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}

// Writes `data` to a pipe whose reader may already have exited: EPIPE, not
// SIGPIPE (which would end this process, and with it every other child).
void write_ignoring_sigpipe(int fd, const std::string& data) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  const bool was_pending = [&] {
    sigset_t pending;
    ::sigpending(&pending);
    return sigismember(&pending, SIGPIPE) == 1;
  }();
  const ssize_t n = ::write(fd, data.data(), data.size());
  if (n < 0 && errno == EPIPE && !was_pending) {
    const timespec zero{0, 0};
    while (::sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Child>> Child::spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("spawn: no program");
  if (spec.stdin_data.size() > 4096)  // a pipe takes it whole, so no write can block
    return absl::InvalidArgumentError("spawn: more than 4 KiB for standard input");
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls (this process has other threads).
  const std::string program = resolve_program(spec.argv[0], spec.env);
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int log_fd = -1;
  if (!spec.log_path.empty()) {
    const std::string log = !spec.cwd.empty() && spec.log_path[0] != '/'
                                ? absl::StrCat(spec.cwd, "/", spec.log_path)
                                : spec.log_path;
    log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(log, ": cannot write the log: ", std::strerror(errno)));
    }
  }
  int in[2] = {-1, -1}, report[2] = {-1, -1};  // report: the child's errno if exec fails
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(report, O_CLOEXEC) != 0) {
    close_all({log_fd, in[0], in[1], report[0], report[1]});
    return absl::InternalError(absl::StrCat("spawn: pipe: ", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    close_all({log_fd, in[0], in[1], report[0], report[1]});
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    if (spec.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before the prctl
    }
    auto onto = [](int from, int to) {
      if (from == to) {
        ::fcntl(to, F_SETFD, 0);  // already there: only drop close-on-exec
      } else {
        ::dup2(from, to);
      }
    };
    onto(in[0], 0);
    if (log_fd >= 0) {
      onto(log_fd, 1);
      onto(log_fd, 2);
    }
    // Signals the launcher's threads block must not stay blocked here.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!spec.cwd.empty() && ::chdir(spec.cwd.c_str()) != 0) {
      const int err = errno;
      (void)!::write(report[1], &err, sizeof err);
      ::_exit(127);
    }
    ::execve(program.c_str(), argv.data(), envp.data());
    const int err = errno;
    (void)!::write(report[1], &err, sizeof err);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with a signal to the group
  close_all({in[0], report[1], log_fd});
  std::unique_ptr<Child> child(new Child());
  child->pid_ = pid;
  int err = 0;
  ssize_t got = 0;
  while ((got = ::read(report[0], &err, sizeof err)) < 0 && errno == EINTR) {
  }
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof err)) {
    ::close(in[1]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {  // it is exiting: no zombie
    }
    child->exit_ = ExitStatus{127, 0};
    return absl::NotFoundError(absl::StrCat(spec.argv[0], ": cannot run it: ", std::strerror(err)));
  }
  if (!spec.stdin_data.empty()) write_ignoring_sigpipe(in[1], spec.stdin_data);
  ::close(in[1]);
  return child;
}

Child::~Child() {
  if (pid_ > 0 && !exit_) stop(absl::Seconds(2));
}

// The leader's exit is seen without reaping it (WNOWAIT): while it is a
// zombie its pid is still the group's id, so what it left running is
// killed by that id with no risk of hitting a process that reused it; only
// then is it reaped.
std::optional<ExitStatus> Child::poll() {
  if (exit_ || pid_ <= 0) return exit_;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid_)
    return exit_;
  ::kill(-pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_ = from_wait(status);
  return exit_;
}

std::optional<ExitStatus> Child::wait_for(absl::Duration timeout) {
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (!poll() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return exit_;
}

void Child::signal_group(int sig) {
  if (pid_ > 0 && !exit_) ::kill(-pid_, sig);  // never after reaping: the id may be reused
}

ExitStatus Child::stop(absl::Duration grace) {
  if (auto e = poll()) return *e;  // its group's leftovers went with it (poll)
  signal_group(SIGTERM);
  if (auto e = wait_for(grace)) return *e;
  signal_group(SIGKILL);
  if (auto e = wait_for(absl::Seconds(10))) return *e;
  // Unkillable for now (uninterruptible sleep): said, and not waited for.
  exit_ = ExitStatus{exit_for_signal(SIGKILL), SIGKILL};
  return *exit_;
}

}  // namespace troupe::launcher
