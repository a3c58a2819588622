// The agent against a stand-in launcher (a control hub in this process):
// workers started with the token on stdin, their pids and exits reported,
// stopped when told, and stopped when the launcher is lost.
#include "launcher/agent.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <condition_variable>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "launcher/process.h"

namespace troupe::launcher {
namespace {

using json = nlohmann::json;
const std::string kToken = "the token of the agent tests, 32+";

struct FakeLauncher {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<json> heard;
  bool joined = false;
  std::unique_ptr<comm::ControlHub> hub;

  FakeLauncher() {
    auto h = comm::ControlHub::listen("127.0.0.1", 0,
                                      {.token = kToken, .log = [](const std::string&) {}},
                                      {[this](int, const std::string& hello) {
                                         std::lock_guard<std::mutex> l(mu);
                                         joined = hello == "agent";
                                         cv.notify_all();
                                         return true;
                                       },
                                       [this](int, std::string f) {
                                         std::lock_guard<std::mutex> l(mu);
                                         heard.push_back(json::parse(f));
                                         cv.notify_all();
                                       },
                                       [](int, absl::Status) {}});
    EXPECT_TRUE(h.ok()) << h.status();
    hub = std::move(*h);
  }
  // The first message of `type` (for `rank`), waiting for it.
  json await(const std::string& type, int rank) {
    std::unique_lock<std::mutex> l(mu);
    json found;
    cv.wait_for(l, std::chrono::seconds(20), [&] {
      for (const json& j : heard)
        if (j["type"] == type && j.value("rank", -1) == rank) return found = j, true;
      return false;
    });
    return found;
  }
  void wait_joined() {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(10), [&] { return joined; }));
  }
};

bool alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

std::vector<std::string> env() { return current_environment(); }

TEST(Agent, StartsReportsAndStopsWorkers) {
  FakeLauncher launcher;
  const std::string out = ::testing::TempDir() + "/agent_token.txt";
  std::remove(out.c_str());
  auto agent = std::async(std::launch::async, [&] {
    return run_agent({.master_addr = "127.0.0.1",
                      .master_port = launcher.hub->port(),
                      .index = 0,
                      .token = kToken});
  });
  launcher.wait_joined();
  json start = {{"type", "start"},
                {"workers",
                 {{{"rank", 0},
                   {"argv", {"sh", "-c", "read t; echo \"$t\" > " + out + "; exit 4"}},
                   {"env", env()}},
                  {{"rank", 1}, {"argv", {"sleep", "100"}}, {"env", env()}},
                  {{"rank", 2}, {"argv", {"/nonexistent/worker"}}, {"env", env()}}}}};
  ASSERT_TRUE(launcher.hub->send(0, start.dump()).ok());
  EXPECT_GT(launcher.await("started", 0).value("pid", 0), 0);
  const int sleeper = launcher.await("started", 1).value("pid", 0);
  EXPECT_TRUE(alive(sleeper));
  EXPECT_NE(launcher.await("error", 2).value("message", "").find("cannot run it"),
            std::string::npos);
  json exited = launcher.await("exited", 0);
  EXPECT_EQ(exited.value("code", -1), 4);
  std::ifstream in(out);
  std::string token;
  std::getline(in, token);
  EXPECT_EQ(token, kToken);  // on stdin, never on the command line
  ASSERT_TRUE(launcher.hub->send(0, json{{"type", "stop"}, {"grace_ms", 2000}}.dump()).ok());
  EXPECT_EQ(launcher.await("exited", 1).value("signal", 0), SIGTERM);
  ASSERT_EQ(agent.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(agent.get(), 0);
  EXPECT_FALSE(alive(sleeper));
}

// The launcher's connection goes without a goodbye (a launcher killed with
// SIGKILL): the agent stops its workers and exits non-zero.
TEST(Agent, LosingTheLauncherStopsEveryWorker) {
  FakeLauncher launcher;
  const std::string ready = ::testing::TempDir() + "/agent_worker_ready";
  std::remove(ready.c_str());
  auto agent = std::async(std::launch::async, [&] {
    return run_agent({.master_addr = "127.0.0.1",
                      .master_port = launcher.hub->port(),
                      .index = 0,
                      .token = kToken,
                      .stop_grace = absl::Milliseconds(500)});
  });
  launcher.wait_joined();
  json start = {{"type", "start"},
                {"workers",
                 {{{"rank", 4},
                   {"argv", {"sh", "-c", "trap '' TERM; echo > " + ready + "; sleep 100"}},
                   {"env", env()}}}}};
  ASSERT_TRUE(launcher.hub->send(0, start.dump()).ok());
  const int pid = launcher.await("started", 4).value("pid", 0);
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 500 && !std::ifstream(ready); i++)  // its TERM trap is set
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(alive(pid));
  const auto t0 = std::chrono::steady_clock::now();
  launcher.hub->drop(0, absl::UnavailableError("as if the launcher died"));
  ASSERT_EQ(agent.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(agent.get(), 1);
  // It ignores TERM: the agent waited out the grace, then killed its group.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(400));
  EXPECT_FALSE(alive(pid)) << "a worker outlived its launcher";
}

}  // namespace
}  // namespace troupe::launcher
