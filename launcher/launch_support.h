// What `troupe launch` is made of besides the run itself: its flags, the
// run directory, the placement of ranks on hosts' slots, the echo of the
// ranks' warnings, and SIGINT/SIGTERM taken by one thread.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "api/prepare_run.h"
#include "api/train_flags.h"
#include "launcher/hostfile.h"

namespace troupe::launcher {

// The flag table and what turns it into a run (api/train_flags.h, api/prepare_run.h).
using api::add_train_flags;
using api::describe_load;
using api::duration;
using api::exit_signal_received;
using api::forwarded_train_flags;
using api::install_exit_signal_handler;
using api::open_load;
using api::prepare_run;
using api::PreparedRun;
using api::Progress;
using api::Runner;
using api::RunRequest;
using api::stage_factory;
using api::TrainFlags;
using api::write_trace_metrics;

struct LaunchFlags {
  TrainFlags train;
  std::string hostfile, hosts, include, exclude;
  int nproc_per_node = 0;
  std::string rsh = "ssh -o BatchMode=yes {host}";
  std::string master_addr;
  int master_port = 0;
  std::string run_dir;
  std::string token_file;
  double join_timeout_s = 120;
  int max_restarts = 0;     // --max-restarts: a failed job starts again from its newest checkpoint
  bool elastic = false;     // --elastic: ... on the hosts still reachable, with the dp that fits
  bool bind_cores = false;  // --bind-cores: each worker on its share of its host's CPUs
};

std::string self_exe();
// This process's command line, as typed.
std::vector<std::string> command_line();
std::string host_name();
// The run directory, absolute (agents on other hosts start elsewhere). A
// default one is new (made with mkdir, so two launches in one second get
// two); a given one may exist, but the logs of an earlier run there go.
absl::StatusOr<std::string> make_run_dir(const std::string& given);
// The last lines of a rank's log, indented, for a failure message (what a
// worker said before it died is often the cause: a bad flag, a file).
std::string log_tail(const std::string& path, std::size_t lines = 3);
absl::Status write_json(const std::string& path, const nlohmann::json& j);
// What the workers on other hosts get from the launcher's environment (over
// their agent's own; on this host they inherit all of it).
bool forwarded_var(absl::string_view kv);

// The job token from `token_file` (its first line) or, without one, from
// TROUPE_JOB_TOKEN; nullopt when neither gives one. An unreadable or empty
// file is InvalidArgument naming --token-file.
absl::StatusOr<std::optional<std::string>> read_job_token(const std::string& token_file);

// Every rank's warnings and errors on the terminal, prefixed with who it is.
class LogEcho {
 public:
  LogEcho(std::vector<std::pair<std::string, std::string>> logs) : logs_(std::move(logs)) {
    offsets_.assign(logs_.size(), 0);
    partial_.assign(logs_.size(), "");
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        scan();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      scan();
    });
  }
  ~LogEcho() {
    stop_ = true;
    thread_.join();
  }

 private:
  void scan() {
    for (std::size_t i = 0; i < logs_.size(); i++) {
      std::ifstream in(logs_[i].second, std::ios::binary);
      if (!in) continue;
      in.seekg(static_cast<std::streamoff>(offsets_[i]));
      std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      offsets_[i] += chunk.size();
      partial_[i] += chunk;
      std::size_t nl;
      while ((nl = partial_[i].find('\n')) != std::string::npos) {
        const std::string line = partial_[i].substr(0, nl);
        partial_[i].erase(0, nl + 1);
        const std::string lower = absl::AsciiStrToLower(line);
        if (absl::StrContains(lower, "error") || absl::StrContains(lower, "warning")) {
          std::fprintf(stderr, "[%s] %s\n", logs_[i].first.c_str(), line.c_str());
        }
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> logs_;  // (who, path)
  std::vector<std::size_t> offsets_;
  std::vector<std::string> partial_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct Job {
  std::vector<Placement> placement;
  std::vector<std::string> hosts;  // distinct, in order of first rank
  bool local = true;
  std::vector<HostSlots> slots;  // every usable slot (a restart with --elastic places again)
};

// The hosts and slots the flags give (--hostfile, --hosts, --include,
// --exclude, --nproc-per-node), and world ranks placed on them.
absl::StatusOr<Job> place(const LaunchFlags& f, int world);
absl::StatusOr<Job> place_on(std::vector<HostSlots> slots, int world, bool local);

// SIGINT and SIGTERM, blocked in every thread (block_interrupts() before
// the first thread starts: threads inherit the mask), taken by one.
void block_interrupts();

sigset_t interrupt_set();

class Interrupts {
 public:
  explicit Interrupts(std::function<void(int)> on_signal)
      : set_(interrupt_set()), on_signal_(std::move(on_signal)) {
    thread_ = std::thread([this] {
      const timespec tick{0, 100'000'000};
      while (!stop_.load()) {
        const int sig = ::sigtimedwait(&set_, nullptr, &tick);
        if (sig > 0) on_signal_(sig);
      }
    });
  }
  ~Interrupts() {
    stop_ = true;
    thread_.join();
  }

 private:
  sigset_t set_;
  std::function<void(int)> on_signal_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace troupe::launcher
