// The per-host agent; see launcher/agent.h.
#include "launcher/agent.h"

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "launcher/process.h"

namespace troupe::launcher {
namespace {

using json = nlohmann::json;

// What the link's thread hands to the agent's own (which spawns: the
// workers die with the thread that started them, so it must be this one).
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<json> commands;
  bool lost = false;
  absl::Status why;

  void put(json j) {
    std::lock_guard<std::mutex> l(mu);
    commands.push_back(std::move(j));
    cv.notify_all();
  }
};

void say(const AgentOptions& o, const std::string& what) {
  std::fprintf(stderr, "troupe agent %d: %s\n", o.index, what.c_str());
}

}  // namespace

void note_sigterm(int) {
  static const char kLine[] = "troupe agent: SIGTERM: going on until the launcher ends the run\n";
  (void)!::write(2, kLine, sizeof(kLine) - 1);
}

static void ignore_signal(int) {}

int run_agent(const AgentOptions& options) {
  {
    // SIGUSR1 asks for traces (the workers write theirs); an agent has none,
    // and must not die of it. A handler, not SIG_IGN, as below.
    struct sigaction sa = {};
    sa.sa_handler = ignore_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, nullptr);
  }
  if (options.survive_sigterm) {
    // A handler, not SIG_IGN: the workers started below get the default back.
    struct sigaction sa = {};
    sa.sa_handler = note_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
  }
  auto inbox = std::make_shared<Inbox>();
  comm::ControlOptions control = options.control;
  control.token = options.token;
  auto link = comm::ControlLink::connect(
      options.master_addr, options.master_port, options.index, "agent", control,
      [inbox, &options](std::string frame) {
        json j = json::parse(frame, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_object()) {
          say(options, "ignored a message that is not a JSON object");
          return;
        }
        inbox->put(std::move(j));
      },
      [inbox](absl::Status why) {
        std::lock_guard<std::mutex> l(inbox->mu);
        inbox->lost = true;
        inbox->why = std::move(why);
        inbox->cv.notify_all();
      });
  if (!link.ok()) {
    say(options, std::string(link.status().message()));
    return 1;
  }
  std::map<int, std::unique_ptr<Child>> workers;  // by rank, still running
  auto send = [&](const json& j) { (void)(*link)->send(j.dump()); };
  auto report_exit = [&](int rank, const ExitStatus& st) {
    send({{"type", "exited"},
          {"rank", rank},
          {"code", st.code},
          {"signal", st.signal},
          {"status", st.describe()}});
  };
  // TERM to every worker at once, one grace for all, then KILL the rest.
  auto stop_all = [&](absl::Duration grace) {
    for (auto& [rank, w] : workers) {
      w->signal_group(SIGTERM);
      w->signal_group(SIGCONT);  // a stopped (hung) process acts on it too
    }
    const absl::Time until = absl::Now() + grace;
    for (auto& [rank, w] : workers) {
      if (!w->wait_for(std::max(until - absl::Now(), absl::ZeroDuration())))
        w->signal_group(SIGKILL);
    }
    for (auto& [rank, w] : workers) report_exit(rank, w->stop(absl::ZeroDuration()));
    workers.clear();
  };
  // One "start" entry: a worker, or an error saying why not.
  auto start_one = [&](const json& w) {
    if (!w.is_object()) return;
    const int rank =
        w.contains("rank") && w["rank"].is_number_integer() ? w["rank"].get<int>() : -1;
    ProcessSpec spec;
    try {
      if (rank < 0) throw std::invalid_argument("a worker without a rank");
      if (workers.count(rank)) throw std::invalid_argument("that rank is already running here");
      spec.argv = w.at("argv").get<std::vector<std::string>>();
      // This host's own environment, with what the launcher forwards set
      // over it; the launcher's working directory (a shared filesystem).
      spec.env = current_environment();
      if (w.contains("env"))
        spec.env = with_overrides(spec.env, w["env"].get<std::vector<std::string>>());
      if (w.contains("log")) spec.log_path = w["log"].get<std::string>();
      if (w.contains("cwd")) spec.cwd = w["cwd"].get<std::string>();
    } catch (const std::exception& e) {
      send({{"type", "error"}, {"rank", rank}, {"message", e.what()}});
      return;
    }
    spec.stdin_data = options.token + "\n";
    auto child = Child::spawn(spec);
    if (!child.ok()) {
      send({{"type", "error"}, {"rank", rank}, {"message", child.status().message()}});
      return;
    }
    send({{"type", "started"}, {"rank", rank}, {"pid", (*child)->pid()}});
    workers[rank] = std::move(*child);
  };
  for (;;) {
    std::deque<json> commands;
    bool lost = false;
    absl::Status why;
    {
      std::unique_lock<std::mutex> l(inbox->mu);
      inbox->cv.wait_for(l, std::chrono::milliseconds(50),
                         [&] { return inbox->lost || !inbox->commands.empty(); });
      commands.swap(inbox->commands);
      lost = inbox->lost;
      why = inbox->why;
    }
    for (const json& c : commands) {
      const std::string type =
          c.contains("type") && c["type"].is_string() ? c["type"].get<std::string>() : "";
      if (type == "stop") {
        const int grace_ms = c.contains("grace_ms") && c["grace_ms"].is_number_integer()
                                 ? c["grace_ms"].get<int>()
                                 : 3000;
        stop_all(absl::Milliseconds(std::clamp(grace_ms, 0, 600000)));
        return 0;
      }
      if (type == "start" && c.contains("workers") && c["workers"].is_array()) {
        for (const json& w : c["workers"]) start_one(w);
      }
    }
    for (auto it = workers.begin(); it != workers.end();) {
      if (auto st = it->second->poll()) {  // (what it left running is killed by poll)
        report_exit(it->first, *st);
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
    if (lost) {
      say(options, absl::StrCat("the launcher is gone (", why.ToString(), "): stopping ",
                                workers.size(), " workers"));
      stop_all(options.stop_grace);
      return why.ok() ? 0 : 1;
    }
  }
}

}  // namespace troupe::launcher
