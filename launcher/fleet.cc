// Local children, or agents through --rsh.
#include "launcher/fleet.h"

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "comm/control_channel.h"

namespace troupe::launcher {
namespace {

using json = nlohmann::json;

class LocalFleet final : public Fleet {
 public:
  explicit LocalFleet(std::string token) : token_(std::move(token)) {}
  ~LocalFleet() override { stop(absl::Seconds(1)); }

  absl::Status start(const std::vector<WorkerLaunch>& workers) override {
    for (const WorkerLaunch& w : workers) {
      absl::StatusOr<std::unique_ptr<Child>> c =
          Child::spawn({.argv = w.argv,
                        .env = with_overrides(current_environment(), w.env),
                        .log_path = w.log,
                        .stdin_data = token_ + "\n",
                        .cwd = w.cwd});
      if (!c.ok()) {
        return absl::Status(c.status().code(),
                            absl::StrCat("starting rank ", w.rank, ": ", c.status().message()));
      }
      events_.push_back({.kind = FleetEvent::Kind::kStarted, .rank = w.rank, .pid = (*c)->pid()});
      running_[w.rank] = *std::move(c);
    }
    return absl::OkStatus();
  }

  std::vector<FleetEvent> poll() override {
    for (auto it = running_.begin(); it != running_.end();) {
      if (std::optional<ExitStatus> st = it->second->poll()) {
        events_.push_back({.kind = FleetEvent::Kind::kExited,
                           .rank = it->first,
                           .exit = *st,
                           .what = st->describe()});
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<FleetEvent> out;
    out.swap(events_);
    return out;
  }

  void stop(absl::Duration grace) override {
    for (auto& [rank, c] : running_) {
      c->signal_group(SIGTERM);
      c->signal_group(SIGCONT);  // a stopped (hung) process acts on it too
    }
    const absl::Time until = absl::Now() + grace;
    for (auto& [rank, c] : running_) {
      if (!c->wait_for(std::max(until - absl::Now(), absl::ZeroDuration()))) {
        c->signal_group(SIGKILL);
      }
      const ExitStatus st = c->stop(absl::ZeroDuration());
      events_.push_back(
          {.kind = FleetEvent::Kind::kExited, .rank = rank, .exit = st, .what = st.describe()});
    }
    running_.clear();
  }

 private:
  std::string token_;
  std::map<int, std::unique_ptr<Child>> running_;
  std::vector<FleetEvent> events_;
};

// One agent per host; their messages come in on the hub's thread.
class AgentFleet final : public Fleet {
 public:
  explicit AgentFleet(AgentFleetOptions o) : o_(std::move(o)) {}
  ~AgentFleet() override { stop(absl::Seconds(1)); }

  absl::Status open() {
    comm::ControlHub::Handlers h{
        .on_join = [this](int index, const std::string&) { return joined(index); },
        .on_frame = [this](int index, std::string frame) { on_frame(index, frame); },
        .on_lost = [this](int index, absl::Status why) { on_lost(index, why); }};
    // (Agents run on other hosts: no local socket.)
    auto hub = comm::ControlHub::listen(
        "0.0.0.0", 0, {.token = o_.token, .peer_name = "agent", .local_socket = false},
        std::move(h));
    if (!hub.ok()) return hub.status();
    hub_ = *std::move(hub);
    for (std::size_t i = 0; i < o_.hosts.size(); i++) {
      std::vector<std::string> argv = rsh_argv(o_.rsh, o_.hosts[i]);
      for (const std::string& a :
           {o_.self, std::string("agent"), std::string("--master-addr"), o_.master_addr,
            std::string("--master-port"), std::to_string(hub_->port()), std::string("--index"),
            std::to_string(i)}) {
        argv.push_back(a);
      }
      if (o_.survive_sigterm) argv.push_back("--exit-signal-handler");
      std::vector<std::string> env = current_environment();
      env.push_back("TROUPE_TOKEN_STDIN=1");
      auto c = Child::spawn({.argv = argv,
                             .env = env,
                             .log_path = absl::StrCat(o_.log_dir, "/agent-", o_.hosts[i], ".log"),
                             .stdin_data = o_.token + "\n"});
      if (!c.ok()) {
        return absl::Status(c.status().code(), absl::StrCat("starting the agent on ", o_.hosts[i],
                                                            ": ", c.status().message()));
      }
      rsh_.push_back(*std::move(c));
    }
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoSeconds(o_.join_timeout);
    while (joined_.size() < o_.hosts.size() && std::chrono::steady_clock::now() < deadline) {
      if (o_.interrupted && o_.interrupted())
        return absl::CancelledError("interrupted while the agents were starting");
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
    for (std::size_t i = 0; i < o_.hosts.size(); i++) {
      if (!joined_.count(static_cast<int>(i))) {
        return absl::DeadlineExceededError(
            absl::StrCat("the agent on host ", o_.hosts[i], " did not connect within ",
                         absl::FormatDuration(o_.join_timeout), " (see ", o_.log_dir, "/agent-",
                         o_.hosts[i], ".log; the --rsh template is '", o_.rsh, "')"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status start(const std::vector<WorkerLaunch>& workers) override {
    std::map<int, json> per_host;
    for (const WorkerLaunch& w : workers) {
      const auto it = std::find(o_.hosts.begin(), o_.hosts.end(), w.host);
      const int index = static_cast<int>(it - o_.hosts.begin());
      {
        std::lock_guard<std::mutex> lock(mu_);
        host_of_[w.rank] = index;
      }
      per_host[index].push_back(
          {{"rank", w.rank}, {"argv", w.argv}, {"env", w.env}, {"log", w.log}, {"cwd", w.cwd}});
    }
    for (auto& [index, list] : per_host) {
      json msg = {{"type", "start"}, {"workers", list}};
      if (absl::Status st = hub_->send(index, msg.dump()); !st.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "the agent on ", o_.hosts[static_cast<std::size_t>(index)], ": ", st.message()));
      }
    }
    return absl::OkStatus();
  }

  int port() const override { return hub_ ? hub_->port() : 0; }

  std::vector<FleetEvent> poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<FleetEvent> out;
    out.swap(events_);
    return out;
  }

  void stop(absl::Duration grace) override {
    if (!hub_) return;
    const json msg = {{"type", "stop"}, {"grace_ms", absl::ToInt64Milliseconds(grace)}};
    for (std::size_t i = 0; i < o_.hosts.size(); i++)
      (void)hub_->send(static_cast<int>(i), msg.dump());
    {
      // Each agent reports its workers' exits and says goodbye.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, absl::ToChronoSeconds(grace + absl::Seconds(5)),
                   [&] { return gone_ == joined_.size(); });
    }
    for (auto& c : rsh_) c->stop(absl::Seconds(2));
    rsh_.clear();
    hub_.reset();
  }

 private:
  bool joined(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index < 0 || static_cast<std::size_t>(index) >= o_.hosts.size() || joined_.count(index)) {
      return false;
    }
    joined_.insert(index);
    cv_.notify_all();
    return true;
  }

  void on_frame(int index, const std::string& frame) {
    json j = json::parse(frame, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer())
      return;
    const int rank = j["rank"].get<int>();
    const std::string type = j.value("type", "");
    std::lock_guard<std::mutex> lock(mu_);
    if (type == "started") {
      events_.push_back(
          {.kind = FleetEvent::Kind::kStarted, .rank = rank, .pid = j.value("pid", 0)});
    } else if (type == "exited") {
      ExitStatus st{.code = j.value("code", 0), .signal = j.value("signal", 0)};
      events_.push_back(
          {.kind = FleetEvent::Kind::kExited, .rank = rank, .exit = st, .what = st.describe()});
    } else if (type == "error") {
      events_.push_back(
          {.kind = FleetEvent::Kind::kLost,
           .rank = rank,
           .what = absl::StrCat("the agent on ", o_.hosts[static_cast<std::size_t>(index)],
                                " could not start it: ", j.value("message", ""))});
    }
  }

  void on_lost(int index, const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    gone_++;
    cv_.notify_all();
    if (why.ok()) return;
    for (const auto& [rank, host] : host_of_) {
      if (host != index) continue;
      events_.push_back(
          {.kind = FleetEvent::Kind::kLost,
           .rank = rank,
           .what = absl::StrCat("lost contact with the agent on host ",
                                o_.hosts[static_cast<std::size_t>(index)], ": ", why.message())});
    }
  }

  AgentFleetOptions o_;
  std::unique_ptr<comm::ControlHub> hub_;
  std::vector<std::unique_ptr<Child>> rsh_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<int> joined_;
  std::size_t gone_ = 0;
  std::map<int, int> host_of_;  // rank -> agent index
  std::vector<FleetEvent> events_;
};

}  // namespace

std::vector<std::string> rsh_argv(const std::string& tmpl, const std::string& host) {
  // Words split on blanks as a shell would, with '...' and "..." quoting
  // (no expansions); {host} replaced inside them.
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char ch : tmpl) {
    if (quote != 0) {
      if (ch == quote) {
        quote = 0;
      } else {
        word += ch;
      }
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
      in_word = true;
    } else if (ch == ' ' || ch == '\t') {
      if (in_word) out.push_back(absl::StrReplaceAll(word, {{"{host}", host}}));
      word.clear();
      in_word = false;
    } else {
      word += ch;
      in_word = true;
    }
  }
  if (in_word) out.push_back(absl::StrReplaceAll(word, {{"{host}", host}}));
  return out;
}

std::unique_ptr<Fleet> local_fleet(const std::string& token) {
  return std::make_unique<LocalFleet>(token);
}

absl::StatusOr<std::unique_ptr<Fleet>> agent_fleet(const AgentFleetOptions& options) {
  auto f = std::make_unique<AgentFleet>(options);
  if (absl::Status st = f->open(); !st.ok()) return st;
  return std::unique_ptr<Fleet>(std::move(f));
}

}  // namespace troupe::launcher
