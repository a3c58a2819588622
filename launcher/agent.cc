// The per-host agent; see launcher/agent.h.
#include "launcher/agent.h"

#include <signal.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

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

int run_agent(const AgentOptions& options) {
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
    send({{"type", "exited"}, {"rank", rank}, {"code", st.code}, {"signal", st.signal},
          {"status", st.describe()}});
  };
  auto stop_all = [&](absl::Duration grace) {
    for (auto& [rank, w] : workers) w->signal_group(SIGTERM);  // all at once, then wait
    for (auto& [rank, w] : workers) report_exit(rank, w->stop(grace));
    workers.clear();
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
      const std::string type = c.value("type", "");
      if (type == "stop") {
        stop_all(absl::Milliseconds(c.value("grace_ms", 3000)));
        return 0;
      }
      if (type != "start" || !c.contains("workers") || !c["workers"].is_array()) continue;
      for (const json& w : c["workers"]) {
        const int rank = w.value("rank", -1);
        ProcessSpec spec;
        try {
          spec.argv = w.at("argv").get<std::vector<std::string>>();
          spec.env = w.value("env", std::vector<std::string>{});
          spec.log_path = w.value("log", std::string());
        } catch (const json::exception& e) {
          send({{"type", "error"}, {"rank", rank}, {"message", e.what()}});
          continue;
        }
        spec.stdin_data = options.token + "\n";
        auto child = Child::spawn(spec);
        if (!child.ok()) {
          send({{"type", "error"}, {"rank", rank}, {"message", child.status().message()}});
          continue;
        }
        send({{"type", "started"}, {"rank", rank}, {"pid", (*child)->pid()}});
        workers[rank] = std::move(*child);
      }
    }
    for (auto it = workers.begin(); it != workers.end();) {
      if (auto st = it->second->poll()) {
        it->second->signal_group(SIGKILL);  // whatever it left running
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
