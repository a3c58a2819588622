// Child processes: exit status, the log, the secret on stdin, stopping a
// whole group, and children that die with the process that started them.
#include "launcher/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace troupe::launcher {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Running, not a zombie waiting for its reaper (in a container, pid 1 may
// take its time).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

bool gone_within(pid_t pid, std::chrono::milliseconds ms) {
  const auto until = std::chrono::steady_clock::now() + ms;
  while (std::chrono::steady_clock::now() < until) {
    if (!alive(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !alive(pid);
}

pid_t read_pid(const std::string& path) {
  for (int i = 0; i < 500; i++) {
    std::ifstream in(path);
    pid_t pid = 0;
    if (in >> pid && pid > 0) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

TEST(Child, ExitCodeLogAndSecretOnStdin) {
  const std::string log = ::testing::TempDir() + "/child_log.txt";
  std::remove(log.c_str());
  auto c = Child::spawn({.argv = {"sh", "-c", "read token; echo \"got $token\"; exit 3"},
                         .env = current_environment(),
                         .log_path = log,
                         .stdin_data = "s3cret\n"});
  ASSERT_TRUE(c.ok()) << c.status();
  auto exited = (*c)->wait_for(absl::Seconds(10));
  ASSERT_TRUE(exited.has_value()) << "it did not exit";
  ExitStatus st = *exited;
  EXPECT_EQ(st.code, 3);
  EXPECT_EQ(st.describe(), "exit code 3");
  EXPECT_EQ(slurp(log), "got s3cret\n");
}

TEST(Child, MissingProgramIsAnErrorNamingIt) {
  auto c = Child::spawn({.argv = {"/nonexistent/troupe"}, .env = {}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/troupe: cannot run it"), std::string::npos);
  EXPECT_FALSE(
      Child::spawn({.argv = {"true"}, .env = {}, .log_path = "/nonexistent/dir/log"}).ok());
}

TEST(Child, StopEndsTheWholeGroup) {
  const std::string pidfile = ::testing::TempDir() + "/grandchild.pid";
  std::remove(pidfile.c_str());
  // The child starts a grandchild and waits for it; TERM is ignored by both.
  auto c = Child::spawn(
      {.argv = {"sh", "-c", "trap '' TERM; sleep 100 & echo $! > " + pidfile + "; wait"},
       .env = current_environment()});
  ASSERT_TRUE(c.ok()) << c.status();
  const pid_t grandchild = read_pid(pidfile);
  ASSERT_GT(grandchild, 0);
  ExitStatus st = (*c)->stop(absl::Milliseconds(200));
  EXPECT_EQ(st.signal, SIGKILL) << st.describe();
  EXPECT_EQ(st.describe(), "killed by SIGKILL");
  EXPECT_TRUE(gone_within(grandchild, std::chrono::seconds(5))) << "the grandchild survived";
}

// The process that started a child is killed with SIGKILL: the child dies
// too (no orphan), without anyone stopping it.
TEST(Child, DiesWithItsParent) {
  const std::string pidfile = ::testing::TempDir() + "/orphan.pid";
  std::remove(pidfile.c_str());
  const pid_t parent = ::fork();
  if (parent == 0) {
    auto c = Child::spawn({.argv = {"sh", "-c", "echo $$ > " + pidfile + "; exec sleep 100"},
                           .env = current_environment()});
    if (!c.ok()) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  const pid_t child = read_pid(pidfile);
  ASSERT_GT(child, 0);
  ASSERT_TRUE(alive(child));
  ::kill(parent, SIGKILL);
  ::waitpid(parent, nullptr, 0);
  EXPECT_TRUE(gone_within(child, std::chrono::seconds(5))) << "an orphan survived its parent";
  ::kill(child, SIGKILL);
}

}  // namespace
}  // namespace troupe::launcher
