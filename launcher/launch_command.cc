// `troupe launch`: a job of one worker process per rank, on this host or
// across hosts, with the coordinator in this process; and `troupe agent`,
// its hands on each host (launcher/agent.h).
//
//   troupe launch --nproc-per-node 8 --tp 2 --pp 2 --dp 2 --model tiny --steps 50
//   troupe launch --hostfile hosts --tp 8 --pp 4 --dp 2 --model gpt3-1.3b ...
//
// The run directory (default runs/<date>-<time>) gets launch.json (command,
// hosts, ranks, pids, placement), rank-NNNNN.log per rank and metrics.jsonl.
// Every failure ends the job: a worker that exits or is killed, an agent or
// host that is lost, SIGINT or SIGTERM; every process is stopped, and the
// exit status says who and why.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actors/coordinator_host.h"
#include "comm/auth.h"
#include "launcher/agent.h"
#include "launcher/commands.h"
#include "launcher/fleet.h"
#include "launcher/hostfile.h"
#include "launcher/launch_support.h"
#include "launcher/train_flags.h"
#include "model/atomic_file.h"

namespace troupe::launcher {
namespace {

using json = nlohmann::json;

int run_launch(LaunchFlags& f) {
  block_interrupts();  // before any thread (the coordinator's, CAF's) starts
  auto fail = [](const std::string& m, int code = 1) {
    std::fprintf(stderr, "troupe launch: error: %s\n", m.c_str());
    return code;
  };
  if (absl::Status st = finish_train_flags(f.train); !st.ok()) return fail(std::string(st.message()));
  absl::StatusOr<model::TrainOptions> options = resolve(f.train);
  if (!options.ok()) return fail(std::string(options.status().message()));
  const actors::ParallelOptions& par = f.train.parallel;
  if (absl::Status st = par.validate(*options); !st.ok()) return fail(std::string(st.message()));
  if (!f.train.save_weights.empty()) {
    if (absl::Status st = check_writable(f.train.save_weights, "--save-weights"); !st.ok()) {
      return fail(std::string(st.message()));
    }
  }
  const int world = par.world();
  absl::StatusOr<Job> job = place(f, world);
  if (!job.ok()) return fail(std::string(job.status().message()));
  absl::StatusOr<std::string> run_dir = make_run_dir(f.run_dir);
  if (!run_dir.ok()) return fail(std::string(run_dir.status().message()));
  std::ofstream metrics(*run_dir + "/metrics.jsonl", std::ios::trunc), user_metrics;
  if (!f.train.metrics_jsonl.empty()) {
    user_metrics.open(f.train.metrics_jsonl, std::ios::trunc);
    if (!user_metrics) return fail(absl::StrCat("--metrics-jsonl ", f.train.metrics_jsonl, ": cannot open for writing"));
  }
  std::string token;
  if (!f.token_file.empty()) {
    std::ifstream in(f.token_file);
    if (!in || !std::getline(in, token) || token.empty()) {
      return fail(absl::StrCat("--token-file ", f.token_file, ": cannot read a token from it"));
    }
  } else if (const char* env = std::getenv("TROUPE_JOB_TOKEN"); env != nullptr && *env) {
    token = env;
  } else {
    absl::StatusOr<std::string> t = comm::new_job_token();
    if (!t.ok()) return fail(std::string(t.status().message()));
    token = *t;
  }
  if (token.size() < comm::kMinTokenLength) {
    return fail(absl::StrCat("the job token (", f.token_file.empty() ? "TROUPE_JOB_TOKEN" : f.token_file,
                             ") has ", token.size(), " characters; it must have at least ",
                             comm::kMinTokenLength));
  }
  // The coordinator resumes from --load's step; each rank loads its own part.
  absl::StatusOr<std::optional<model::ckpt::Checkpoint>> loaded = open_load(f.train, *options);
  if (!loaded.ok()) return fail(std::string(loaded.status().message()));
  const model::ckpt::Checkpoint* load = loaded->has_value() ? &**loaded : nullptr;
  const actors::CheckpointOptions& ck = f.train.checkpoint;
  std::atomic<bool> exit_signal{false};
  model::TrainOptions o = *options;
  o.model = par.sliced_config(o.model);
  const std::string master =
      !f.master_addr.empty() ? f.master_addr : (job->local ? "127.0.0.1" : host_name());
  absl::StatusOr<std::unique_ptr<actors::CoordinatorHost>> host = actors::CoordinatorHost::listen(
      {.options = o, .parallel = par, .listen_host = job->local ? "127.0.0.1" : "0.0.0.0",
       .port = f.master_port, .token = token, .join_timeout = absl::Seconds(f.join_timeout_s),
       .checkpoints = {.flags = ck,
                       .loaded = load,
                       .exit_requested = [&exit_signal] { return exit_signal.load(); },
                       .log = [](const std::string& line) {
                         std::printf("%s\n", line.c_str());
                         std::fflush(stdout);
                       }}});
  if (!host.ok()) return fail(std::string(host.status().message()));
  actors::CoordinatorHost& coordinator = **host;

  // The banner and the placement table.
  const comm::Layout layout = par.layout();
  std::map<std::string, int> per_host;
  for (const Placement& p : job->placement) per_host[p.host]++;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::printf("troupe launch: %s\n", o.model.describe().c_str());
  std::printf("  %s: %d worker processes on %zu host(s); schedule %s, %d micro-batches of %d per "
              "replica and step = global batch %d; %d steps\n",
              layout.describe().c_str(), world, job->hosts.size(),
              actors::schedule_name(par.schedule).c_str(), par.m(o), o.micro_batch,
              o.global_batch, o.steps);
  std::printf("  run directory: %s\n  coordinator: %s:%d\n", run_dir->c_str(), master.c_str(),
              coordinator.port());
  if (load != nullptr) std::printf("  %s\n", describe_load(f.train, *load).c_str());
  std::printf("  %5s  %-9s  %-20s  %5s  %7s\n", "rank", "(d,s,t)", "host", "local", "threads");
  std::vector<WorkerLaunch> launches;
  std::vector<std::pair<std::string, std::string>> logs;
  const std::vector<std::string> flags = forwarded_train_flags(f.train, {"--metrics-jsonl"});
  std::vector<std::string> env_base;
  if (!job->local) {
    for (const std::string& kv : current_environment()) {
      if (forwarded_var(kv)) env_base.push_back(kv);
    }
  }
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  for (const Placement& p : job->placement) {
    const comm::Coord c = layout.coord(p.rank);
    const int local = per_host[p.host];
    const int threads = o.threads > 0 ? o.threads : std::max(1, cores / local);
    std::printf("  %5d  (%d,%d,%d)%*s  %-20s  %5d  %7d\n", p.rank, c.d, c.s, c.t,
                static_cast<int>(9 - absl::StrFormat("(%d,%d,%d)", c.d, c.s, c.t).size()), "",
                p.host.c_str(), p.local_rank, threads);
    WorkerLaunch w{.rank = p.rank, .host = p.host};
    w.argv = {self_exe(), "worker"};
    w.argv.insert(w.argv.end(), flags.begin(), flags.end());
    for (const std::string& a :
         {std::string("--rank"), std::to_string(p.rank), std::string("--world"),
          std::to_string(world), std::string("--master-addr"), master, std::string("--master-port"),
          std::to_string(coordinator.port()), std::string("--join-timeout"),
          absl::StrCat(f.join_timeout_s)}) {
      w.argv.push_back(a);
    }
    if (o.threads <= 0) {
      w.argv.push_back("--threads");
      w.argv.push_back(std::to_string(threads));
    }
    w.env = env_base;
    w.env.push_back("TROUPE_TOKEN_STDIN=1");
    w.env.push_back(absl::StrCat("LOCAL_RANK=", p.local_rank));
    w.env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", local));
    w.log = absl::StrFormat("%s/rank-%05d.log", *run_dir, p.rank);
    w.cwd = cwd;
    logs.emplace_back(absl::StrFormat("rank %d (%d,%d,%d) %s", p.rank, c.d, c.s, c.t, p.host), w.log);
    launches.push_back(std::move(w));
  }
  std::fflush(stdout);

  json record = {{"command", command_line()}, {"hosts", job->hosts}, {"world", world},
                 {"layout", {{"tp", par.tp}, {"pp", par.pp}, {"dp", par.dp}}},
                 {"coordinator", absl::StrCat(master, ":", coordinator.port())}, {"ranks", json::array()}};
  for (const Placement& p : job->placement) {
    const comm::Coord c = layout.coord(p.rank);
    record["ranks"].push_back({{"rank", p.rank}, {"d", c.d}, {"s", c.s}, {"t", c.t}, {"host", p.host},
                               {"local_rank", p.local_rank}, {"pid", nullptr},
                               {"log", launches[static_cast<std::size_t>(p.rank)].log},
                               {"argv", launches[static_cast<std::size_t>(p.rank)].argv}});
  }
  const std::string record_path = *run_dir + "/launch.json";
  if (absl::Status st = write_json(record_path, record); !st.ok()) return fail(std::string(st.message()));

  // SIGINT/SIGTERM end the run.
  std::atomic<int> interrupted{0};
  Interrupts interrupts([&](int sig) {
    if (sig == SIGTERM && ck.exit_signal_handler && !exit_signal.load()) {
      // (Megatron's --exit-signal-handler: SLURM's notice before preemption.)
      std::printf("troupe launch: SIGTERM: saving after this step, then exiting\n");
      std::fflush(stdout);
      exit_signal = true;
      return;
    }
    interrupted = sig;
    coordinator.cancel(absl::CancelledError(absl::StrCat("interrupted by ", sig == SIGINT ? "SIGINT" : "SIGTERM")));
  });
  std::unique_ptr<Fleet> fleet;
  if (job->local) {
    fleet = local_fleet(token);
  } else {
    absl::StatusOr<std::unique_ptr<Fleet>> agents = agent_fleet(
        {.hosts = job->hosts, .rsh = f.rsh, .self = self_exe(), .master_addr = master,
         .token = token, .log_dir = *run_dir, .join_timeout = absl::Seconds(f.join_timeout_s),
         .interrupted = [&] { return interrupted.load() != 0; }});
    if (!agents.ok()) {
      return fail(std::string(agents.status().message()), interrupted.load() ? 128 + interrupted.load() : 1);
    }
    fleet = *std::move(agents);
  }
  if (absl::Status st = fleet->start(launches); !st.ok()) {
    fleet->stop(absl::Seconds(3));
    return fail(std::string(st.message()));
  }
  if (fleet->port() != 0) {
    record["agent_port"] = fleet->port();
    (void)write_json(record_path, record);
  }
  auto echo = std::make_unique<LogEcho>(logs);

  // Exits and losses, as they happen: a worker gone before the end ends the run.
  std::mutex mu;
  std::map<int, std::string> exits;  // rank -> how it ended
  std::atomic<bool> over{false};
  std::atomic<int> running{world};
  // Ranks that have exited or were lost (their agent's host cut off: no
  // exit will ever be heard of them), each counted once: the end below does
  // not wait for ranks it cannot hear from (a regression: it waited its 5 s
  // for them, and a cut link took 10 s to end the job).
  std::set<int> ended;
  std::atomic<bool> stopping{false};  // from here on, exits are the launcher's own kills
  auto watch = [&] {
    bool dirty = false;
    for (const FleetEvent& e : fleet->poll()) {
      if (e.rank < 0 || e.rank >= world) continue;  // (an agent's confusion)
      auto& rank_record = record["ranks"][static_cast<std::size_t>(e.rank)];
      if (e.kind == FleetEvent::Kind::kStarted) {
        rank_record["pid"] = e.pid;
        dirty = true;
        continue;
      }
      rank_record["exit"] = e.what;
      dirty = true;
      if (ended.insert(e.rank).second) running--;
      const bool bad = e.kind == FleetEvent::Kind::kLost || !e.exit.ok();
      if (bad && e.exit.code != 3 && !stopping.load()) {
        std::lock_guard<std::mutex> lock(mu);
        exits.emplace(e.rank, e.what);
      }
      if (bad && !over.load()) {
        coordinator.cancel(absl::UnavailableError(absl::StrCat(coordinator.who(e.rank), ": ", e.what)));
      }
    }
    if (dirty) (void)write_json(record_path, record);
  };
  std::atomic<bool> stop_watch{false};
  std::thread watcher([&] {
    while (!stop_watch.load()) {
      watch();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  Progress progress(o.steps, {&metrics, user_metrics.is_open() ? &user_metrics : nullptr});
  absl::Status st = coordinator.run(
      [&](const model::StepMetrics& m) {
        progress.report(m);
      },
      [&](const std::vector<actors::CoordinatorHost::Member>& members) {
        std::printf("  train data: %s\n", members[0].hello.train_data.c_str());
        std::fflush(stdout);
      });
  over = true;
  echo.reset();  // what the ranks say after the end is in their logs
  // Every worker is done (run() waits for that, or for its loss); they exit
  // by themselves. (After a failure a lost worker -- hung, cut off -- will
  // not: the wait is short, and the stop below ends it.)
  const absl::Time until = absl::Now() + (st.ok() ? absl::Seconds(10) : absl::Seconds(2));
  while (running.load() > 0 && absl::Now() < until && interrupted.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop_watch = true;
  watcher.join();
  watch();
  stopping = true;
  fleet->stop(absl::Seconds(3));
  watch();
  // The processes that failed by themselves (killed, crashed, lost) come
  // first: the coordinator may have heard of the failure second-hand (a
  // peer's receive failing) before it heard of the death.
  std::vector<std::string> causes;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [rank, what] : exits) {
      causes.push_back(absl::StrCat(coordinator.who(rank), ": ", what,
                                    log_tail(launches[static_cast<std::size_t>(rank)].log)));
    }
  }
  if (!st.ok()) {
    std::string msg = causes.empty() ? std::string(st.message())
                                     : absl::StrCat(absl::StrJoin(causes, "\n  "), "\n  the run: ",
                                                    st.message());
    return fail(absl::StrCat(msg, "\n  logs: ", *run_dir), interrupted.load() ? 128 + interrupted.load() : 1);
  }
  if (!causes.empty()) {
    return fail(absl::StrCat("the run ended, but ", absl::StrJoin(causes, "; "), "\n  logs: ", *run_dir));
  }
  if (!f.train.save_weights.empty()) std::printf("saved weights to %s\n", f.train.save_weights.c_str());
  std::printf("run directory: %s\n", run_dir->c_str());
  return 0;
}

}  // namespace

Command add_launch_command(CLI::App& app) {
  auto f = std::make_shared<LaunchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Train with one worker process per rank, on this host or across hosts");
  add_train_flags(cmd, f->train);
  cmd->add_option("--hostfile", f->hostfile, "DeepSpeed hostfile: `host slots=N` lines");
  cmd->add_option("--hosts", f->hosts, "Hosts, comma-separated (each --nproc-per-node slots)");
  cmd->add_option("--nproc-per-node", f->nproc_per_node,
                  "Workers per host (default: the whole job on this host)");
  cmd->add_option("--include", f->include, "Only these hosts/slots: host:slot,slot@host2");
  cmd->add_option("--exclude", f->exclude, "Not these hosts/slots: host:slot,slot@host2");
  cmd->add_option("--rsh", f->rsh, "How to run the agent on a host ({host} is replaced)")
      ->capture_default_str();
  cmd->add_option("--master-addr", f->master_addr, "The address workers reach this launcher at");
  cmd->add_option("--master-port", f->master_port, "The coordinator's port (default: any free)");
  cmd->add_option("--run-dir", f->run_dir, "Logs, launch.json, metrics (default runs/<date>-<time>)");
  cmd->add_option("--token-file", f->token_file,
                  "The job token's file (default: TROUPE_JOB_TOKEN, or a new random one)");
  cmd->add_option("--join-timeout", f->join_timeout_s, "Seconds for the job to assemble")
      ->capture_default_str();
  return [f] { return run_launch(*f); };
}

Command add_agent_command(CLI::App& app) {
  auto o = std::make_shared<AgentOptions>();
  CLI::App* cmd = app.add_subcommand("agent", "The launcher's agent on a host (started by launch)");
  cmd->group("");  // not for people
  cmd->add_option("--master-addr", o->master_addr, "The launcher's address")->required();
  cmd->add_option("--master-port", o->master_port, "The launcher's agent port")->required();
  cmd->add_option("--index", o->index, "Which host of the job")->required();
  return [o] {
    std::string token;
    std::getline(std::cin, token);  // the launcher writes it on our stdin
    if (token.empty()) {
      std::fprintf(stderr, "troupe agent: error: no job token on standard input\n");
      return 1;
    }
    o->token = token;
    return run_agent(*o);
  };
}

}  // namespace troupe::launcher
