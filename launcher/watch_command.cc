// `troupe watch`: attaches to a running `troupe launch` job's coordinator
// (with the job token) and shows its progress line and its lines
// (checkpoints, warnings) live, until the job ends. Several may watch at
// once; a watcher that leaves or dies never disturbs the job.
//
//   troupe watch --master-addr node0 --master-port 29500 --token-file RUNDIR/token
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "api/train_flags.h"
#include "launcher/commands.h"
#include "launcher/launch_support.h"
#include "troupe/troupe.h"

namespace troupe::launcher {
namespace {

struct WatchFlags {
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string token_file;
  int log_interval = 0;
  double connect_timeout_s = 10;
};

int run_watch(const WatchFlags& f) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "troupe watch: error: %s\n", message.c_str());
    return 1;
  };
  absl::StatusOr<std::optional<std::string>> token = read_job_token(f.token_file);
  if (!token.ok()) return fail(std::string(token.status().message()));
  if (!token->has_value()) {
    return fail(
        "no job token: give --token-file (troupe launch writes its token to RUNDIR/token) or set "
        "TROUPE_JOB_TOKEN");
  }
  caf::actor_system_config cfg;
  add_message_types(cfg);
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  absl::StatusOr<std::unique_ptr<JobWatcher>> watcher =
      JobWatcher::attach({.host = f.master_addr,
                          .port = f.master_port,
                          .token = **token,
                          .connect_timeout_s = f.connect_timeout_s,
                          .name = "launch"},
                         caf::actor(self));
  if (!watcher.ok()) return fail(std::string(watcher.status().message()));
  const JobWatcher::Hello& hello = (*watcher)->hello();
  std::printf("troupe watch: %s:%d: %s; %s; at step %d of %d\n", f.master_addr.c_str(),
              f.master_port, hello.model.c_str(), hello.layout.c_str(), hello.step, hello.steps);
  std::fflush(stdout);
  api::Progress progress(hello.steps, std::vector<std::ofstream*>{}, f.log_interval);
  bool ended = false;
  std::string error;
  int steps_done = hello.step;
  self->receive_while([&] { return !ended; })(
      [&](metrics_atom, const std::string&, const StepMetrics& m) { progress.report(m); },
      [&](log_atom, const std::string&, const std::string& line) {
        progress.finish();  // (a live line ends before it)
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      },
      [&](validation_atom, const std::string&, int, double) {},  // (in the progress line)
      [&](checkpoint_atom, const std::string&, int, const std::string&) {},  // (a log line says it)
      [&](stall_atom, const std::string&, const std::string&) {},
      [&](failure_atom, const std::string&, const std::string&) {},
      [&](ended_atom, const std::string&, int steps, const std::string& why) {
        ended = true;
        steps_done = steps;
        error = why;
      });
  progress.finish();
  if (!error.empty()) {
    std::fprintf(stderr, "troupe watch: the job failed after step %d: %s\n", steps_done,
                 error.c_str());
    return 1;
  }
  std::printf("troupe watch: the job ended after step %d\n", steps_done);
  return 0;
}

}  // namespace

Command add_watch_command(CLI::App& app) {
  auto f = std::make_shared<WatchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "watch", "Attach to a running `troupe launch` job and show its progress live");
  cmd->add_option("--master-addr", f->master_addr, "The job's coordinator host")
      ->capture_default_str();
  cmd->add_option("--master-port", f->master_port, "The job's coordinator port")
      ->required()
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--token-file", f->token_file,
                  "The job token's file (troupe launch writes RUNDIR/token; default: "
                  "TROUPE_JOB_TOKEN)");
  cmd->add_option("--log-interval", f->log_interval,
                  "A progress line every N steps (default: as troupe train's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--connect-timeout", f->connect_timeout_s, "Seconds to attach within")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return [f] { return run_watch(*f); };
}

}  // namespace troupe::launcher
