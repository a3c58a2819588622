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

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actors/diagnostics/trace_file.h"
#include "actors/runtime/coordinator_host.h"
#include "api/train_flags.h"
#include "comm/auth.h"
#include "launcher/agent.h"
#include "launcher/commands.h"
#include "launcher/exit_codes.h"
#include "launcher/fleet.h"
#include "launcher/fleet_watch.h"
#include "launcher/hostfile.h"
#include "launcher/launch_restart.h"
#include "launcher/launch_support.h"
#include "launcher/launch_workers.h"
#include "model/atomic_file.h"

namespace troupe::launcher {
namespace {

using json = nlohmann::json;

// What every start of a job shares: the flags, the run directory, the
// token, the metrics and the signals.
struct LaunchContext {
  LaunchContext(LaunchFlags& flags, model::TrainOptions o) : f(flags), options(std::move(o)) {}
  LaunchFlags& f;
  model::TrainOptions options;  // resolved, the model unsliced
  std::string run_dir, token;
  std::string token_source;  // --token-file's path, "env" (TROUPE_JOB_TOKEN), or RUNDIR/token
  std::string device_why;    // resolve_device's, where the launcher chose the device
  std::ofstream metrics, user_metrics;
  std::unique_ptr<Progress> progress;
  std::atomic<int> interrupted{0};
  std::atomic<bool> exit_signal{false};
  std::mutex mu;
  actors::CoordinatorHost* current = nullptr;  // the running start's (for the signal thread)
  json restarts = json::array();               // launch.json's record of them
  RestartMemo memo;
};

absl::Status write_token(const std::string& path, const std::string& token) {
  absl::StatusOr<model::AtomicFile> file = model::AtomicFile::create(path, 0600);
  absl::Status st = file.status();
  if (st.ok()) st = file->write(token + "\n");
  if (st.ok()) st = file->commit();
  return st;
}

Outcome failed(std::string message, int code = 1) {
  return {.code = code,
          .message = std::move(message),
          .restartable = false,
          .lost_hosts = {},
          .failed_at = {}};
}

// How a start ended, from the run's status and the workers that failed by
// themselves (those come first: the coordinator may have heard of a
// failure second-hand -- a peer's receive failing -- before the death).
Outcome attempt_outcome(const LaunchContext& ctx, const AttemptPlan& plan, const absl::Status& st,
                        const FleetWatch::Failures& failures,
                        std::chrono::steady_clock::time_point run_ended,
                        const std::function<std::string(int)>& who,
                        const std::vector<WorkerLaunch>& launches) {
  std::vector<std::string> causes;
  for (const auto& [rank, what] : failures.exits) {
    causes.push_back(absl::StrCat(who(rank), ": ", what,
                                  log_tail(launches[static_cast<std::size_t>(rank)].log)));
  }
  Outcome out;
  out.lost_hosts = failures.lost_hosts;
  out.failed_at = failures.failed_at.value_or(run_ended);
  // A rank killed, crashed or cut off, or one gone silent or hung (the
  // heartbeats, the stall watchdog): a restart may help. Bad input, a full
  // disk or a damaged checkpoint would fail again: they end the job.
  out.restartable = failures.died || absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st);
  const int sig = ctx.interrupted.load();
  if (sig != 0 || st.ok()) out.restartable = false;
  if (!st.ok()) {
    std::string msg =
        causes.empty() ? std::string(st.message())
                       : absl::StrCat(absl::StrJoin(causes, "\n  "), "\n  the run: ", st.message());
    out.message =
        absl::StrCat(msg, "\n  logs: ", ctx.run_dir, "\n  ",
                     actors::flight_note(failure_dir(ctx.f, plan.index), absl::OkStatus()));
    out.code = sig ? exit_for_signal(sig) : kExitFailed;
    return out;
  }
  if (!causes.empty()) {
    out.message =
        absl::StrCat("the run ended, but ", absl::StrJoin(causes, "; "), "\n  logs: ", ctx.run_dir);
    out.code = kExitFailed;
  }
  return out;
}

Outcome run_attempt(LaunchContext& ctx, const AttemptPlan& plan) {
  const LaunchFlags& f = ctx.f;
  const actors::ParallelOptions& par = plan.parallel;
  const Job& job = plan.job;
  const int world = par.world();
  // The coordinator resumes from --load's step; each rank loads its own part.
  TrainFlags train = f.train;
  train.parallel = par;
  train.checkpoint.load = plan.load;
  train.checkpoint.load_optim = plan.load_optim;
  absl::StatusOr<std::optional<model::ckpt::Checkpoint>> loaded = open_load(train, ctx.options);
  if (!loaded.ok()) return failed(std::string(loaded.status().message()));
  const model::ckpt::Checkpoint* load = loaded->has_value() ? &**loaded : nullptr;
  model::TrainOptions o = ctx.options;
  o.model = par.sliced_config(o.model);
  const std::string master =
      !f.master_addr.empty() ? f.master_addr : (job.local ? "127.0.0.1" : host_name());
  absl::StatusOr<std::unique_ptr<actors::CoordinatorHost>> host = actors::CoordinatorHost::listen(
      {.options = o,
       .parallel = par,
       .listen_host = job.local ? "127.0.0.1" : "0.0.0.0",
       .port = f.master_port,
       .token = ctx.token,
       .control = {.local_socket = job.local},  // (its workers on this host are told its name)
       .join_timeout = absl::Seconds(f.join_timeout_s),
       .checkpoints = {.flags = train.checkpoint,
                       .loaded = load,
                       .exit_requested = [&ctx] { return ctx.exit_signal.load(); },
                       .log =
                           [](const std::string& line) {
                             std::printf("%s\n", line.c_str());
                             std::fflush(stdout);
                           }}});
  if (!host.ok()) return failed(std::string(host.status().message()));
  actors::CoordinatorHost& coordinator = **host;
  // This start's trace files only (an earlier start's ranks may differ).
  for (const std::string& dir : {f.train.trace.dir, flight_dir(f, plan.index)}) {
    if (!dir.empty()) actors::remove_trace_files(dir);
  }

  // The banner and the placement table.
  const comm::Layout layout = par.layout();
  if (plan.index == 0) std::printf("troupe launch: %s\n", o.model.describe().c_str());
  std::printf(
      "  %s: %d worker processes on %zu host(s); schedule %s, %d micro-batches of %d per "
      "replica and step = global batch %d; %d steps\n",
      layout.describe().c_str(), world, job.hosts.size(),
      actors::schedule_name(par.schedule).c_str(), par.m(o), o.micro_batch, o.global_batch,
      o.steps);
  std::printf(
      "  run directory: %s\n  coordinator: %s:%d (watch it: troupe watch --master-addr %s "
      "--master-port %d%s)\n",
      ctx.run_dir.c_str(), master.c_str(), coordinator.port(), master.c_str(), coordinator.port(),
      ctx.token_source == "env" ? " with TROUPE_JOB_TOKEN"
                                : absl::StrCat(" --token-file ", ctx.token_source).c_str());
  if (load != nullptr) std::printf("  %s\n", describe_load(train, *load).c_str());
  if (plan.index == 0 && !ctx.device_why.empty()) {
    std::printf("  device: %s\n", ctx.device_why.c_str());
  }
  std::printf("  %5s  %-9s  %-20s  %5s  %7s  %s\n", "rank", "(d,s,t)", "host", "local", "threads",
              "device");
  WorkerLaunches workers =
      worker_launches({.f = f,
                       .plan = plan,
                       .options = o,
                       .run_dir = ctx.run_dir,
                       .master = master,
                       .port = coordinator.port(),
                       // (every worker on this host)
                       .local_socket = job.local ? coordinator.local_name() : ""});
  const std::vector<WorkerLaunch>& launches = workers.launches;
  std::fflush(stdout);

  json record =
      launch_record(plan, workers, absl::StrCat(master, ":", coordinator.port()), ctx.restarts);
  const std::string record_path = ctx.run_dir + "/launch.json";
  if (absl::Status st = write_json(record_path, record); !st.ok())
    return failed(std::string(st.message()));

  {
    std::lock_guard<std::mutex> lock(ctx.mu);
    ctx.current = &coordinator;
  }
  struct Unregister {
    LaunchContext& ctx;
    ~Unregister() {
      std::lock_guard<std::mutex> lock(ctx.mu);
      ctx.current = nullptr;
    }
  } unregister{ctx};
  if (ctx.interrupted.load() != 0)
    return failed("interrupted", exit_for_signal(ctx.interrupted.load()));
  std::unique_ptr<Fleet> fleet;
  if (job.local) {
    fleet = local_fleet(ctx.token);
  } else {
    absl::StatusOr<std::unique_ptr<Fleet>> agents =
        agent_fleet({.hosts = job.hosts,
                     .rsh = f.rsh,
                     .self = self_exe(),
                     .master_addr = master,
                     .token = ctx.token,
                     .log_dir = ctx.run_dir,
                     .join_timeout = absl::Seconds(f.join_timeout_s),
                     .interrupted = [&ctx] { return ctx.interrupted.load() != 0; },
                     .survive_sigterm = f.train.checkpoint.exit_signal_handler});
    if (!agents.ok()) {
      const int sig = ctx.interrupted.load();
      return failed(std::string(agents.status().message()),
                    sig ? exit_for_signal(sig) : kExitFailed);
    }
    fleet = *std::move(agents);
  }
  if (absl::Status st = fleet->start(launches); !st.ok()) {
    fleet->stop(absl::Seconds(3));
    return failed(std::string(st.message()));
  }
  if (fleet->port() != 0) {
    record["agent_port"] = fleet->port();
    (void)write_json(record_path, record);
  }
  auto echo = std::make_unique<LogEcho>(workers.logs);

  // Exits and losses, as they happen: a worker gone before the end ends the run.
  FleetWatch watch(*fleet, coordinator,
                   {.job = job, .world = world, .record = record, .record_path = record_path});
  bool first_step = true;
  absl::Status st = coordinator.run(
      [&](const model::StepMetrics& m) {
        ctx.progress->report(m);
        if (first_step && plan.failed_at) {
          std::printf(
              "troupe launch: training again at step %d, %.2f s after the failure\n", m.step,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - *plan.failed_at)
                  .count());
          std::fflush(stdout);
        }
        first_step = false;
      },
      [&](const std::vector<actors::CoordinatorHost::Member>& members) {
        if (plan.index == 0) std::printf("  train data: %s\n", members[0].hello.train_data.c_str());
        std::fflush(stdout);
      });
  const auto run_ended = std::chrono::steady_clock::now();
  watch.run_over();
  echo.reset();  // what the ranks say after the end is in their logs
  // Every worker is done (run() waits for that, or for its loss); they exit
  // by themselves. (After a failure a lost worker -- hung, cut off -- will
  // not: the wait is short, and the stop below ends it.)
  watch.wait_for_exits(absl::Now() + (st.ok() ? absl::Seconds(10) : absl::Seconds(2)),
                       [&ctx] { return ctx.interrupted.load() != 0; });
  watch.stop_fleet(absl::Seconds(3));
  return attempt_outcome(
      ctx, plan, st, watch.failures(), run_ended, [&](int rank) { return coordinator.who(rank); },
      launches);
}

int run_launch(LaunchFlags& f) {
  block_interrupts();  // before any thread (the coordinator's, CAF's) starts
  auto fail = [](const std::string& m, int code = 1) {
    std::fprintf(stderr, "troupe launch: error: %s\n", m.c_str());
    return code;
  };
  // (Each worker opens its own device, LOCAL_RANK's GPU; --device's default
  // is resolved once the workers are placed.)
  absl::StatusOr<PreparedRun> run = prepare_run(f.train, {.runner = Runner::kLaunch});
  if (!run.ok()) return fail(std::string(run.status().message()));
  if (run->printed) return 0;  // (--print-config: no worker is started)
  const model::TrainOptions* options = &run->options;
  const actors::ParallelOptions& par = f.train.parallel;
  if (f.max_restarts < 0) return fail("--max-restarts must not be negative");
  if (f.max_restarts > 0 && f.train.checkpoint.save.empty()) {
    return fail("--max-restarts needs --save DIR: a restart resumes from its newest checkpoint");
  }
  if (f.elastic && f.max_restarts == 0) return fail("--elastic needs --max-restarts K");
  absl::StatusOr<Job> job = place(f, par.world());
  if (!job.ok()) return fail(std::string(job.status().message()));
  // A job on this host alone: this host's default, for the table and the
  // workers (on several hosts each worker resolves its own).
  std::string default_why;
  if (job->local) {
    default_why = api::resolve_device(f.train, /*process_per_rank=*/true, par.world());
  }
  LaunchContext ctx(f, *options);
  ctx.device_why = std::move(default_why);
  absl::StatusOr<std::string> run_dir = make_run_dir(f.run_dir);
  if (!run_dir.ok()) return fail(std::string(run_dir.status().message()));
  ctx.run_dir = *run_dir;
  // Every worker writes its flight recorder here when the run fails.
  if (f.train.trace.flight_dir.empty()) f.train.trace.flight_dir = ctx.run_dir + "/flight";
  const std::string metrics_path = ctx.run_dir + "/metrics.jsonl";
  ctx.metrics.open(metrics_path, std::ios::trunc);
  if (!f.train.metrics_jsonl.empty()) {
    ctx.user_metrics.open(f.train.metrics_jsonl, std::ios::trunc);
    if (!ctx.user_metrics)
      return fail(
          absl::StrCat("--metrics-jsonl ", f.train.metrics_jsonl, ": cannot open for writing"));
  }
  auto metric_streams = [&ctx] {
    return std::vector<std::ofstream*>{&ctx.metrics,
                                       ctx.user_metrics.is_open() ? &ctx.user_metrics : nullptr};
  };
  ctx.progress = std::make_unique<Progress>(options->steps, metric_streams(), f.train.log_interval);
  absl::StatusOr<std::optional<std::string>> given = read_job_token(f.token_file);
  if (!given.ok()) return fail(std::string(given.status().message()));
  if (given->has_value()) {
    ctx.token = **given;
    ctx.token_source = f.token_file.empty() ? "env" : f.token_file;
  } else {
    absl::StatusOr<std::string> t = comm::new_job_token();
    if (!t.ok()) return fail(std::string(t.status().message()));
    ctx.token = *t;
  }
  if (ctx.token.size() < comm::kMinTokenLength) {
    return fail(absl::StrCat(
        "the job token (", f.token_file.empty() ? "TROUPE_JOB_TOKEN" : f.token_file, ") has ",
        ctx.token.size(), " characters; it must have at least ", comm::kMinTokenLength));
  }
  // A token made here is written for `troupe watch --token-file
  // RUNDIR/token` (only its owner may read it); one the user gave is where
  // the user keeps it, and is not copied.
  if (ctx.token_source.empty()) {
    ctx.token_source = ctx.run_dir + "/token";
    if (absl::Status st = write_token(ctx.token_source, ctx.token); !st.ok()) {
      return fail(std::string(st.message()));
    }
  }

  // SIGINT/SIGTERM end the run (with --exit-signal-handler SIGTERM ends it
  // after a checkpoint).
  Interrupts interrupts([&ctx](int sig) {
    if (sig == SIGUSR1) {
      std::lock_guard<std::mutex> lock(ctx.mu);
      if (ctx.current != nullptr) ctx.current->request_traces("signal");
      std::printf(
          "troupe launch: SIGUSR1: every rank writes its trace (%s; each rank's log "
          "says where)\n",
          ctx.f.train.trace.dir.empty() ? "the flight directory" : ctx.f.train.trace.dir.c_str());
      std::fflush(stdout);
      return;
    }
    if (sig == SIGTERM && ctx.f.train.checkpoint.exit_signal_handler && !ctx.exit_signal.load()) {
      // (Megatron's --exit-signal-handler: SLURM's notice before preemption.)
      std::printf("troupe launch: SIGTERM: saving after the step in progress, then exiting\n");
      std::fflush(stdout);
      ctx.exit_signal = true;
      return;
    }
    ctx.interrupted = sig;
    std::lock_guard<std::mutex> lock(ctx.mu);
    if (ctx.current != nullptr) {
      ctx.current->cancel(absl::CancelledError(
          absl::StrCat("interrupted by ", sig == SIGINT ? "SIGINT" : "SIGTERM")));
    }
  });
  if (!f.train.checkpoint.save.empty()) {
    absl::StatusOr<model::ckpt::Checkpoint> there =
        model::ckpt::Checkpoint::open(f.train.checkpoint.save);
    if (there.ok()) {
      ctx.memo.save_at_start = checkpoint_identity(*there);
      std::error_code ec;
      absl::StatusOr<model::ckpt::Checkpoint> first =
          f.train.checkpoint.load.empty() ? absl::NotFoundError("")
                                          : model::ckpt::Checkpoint::open(f.train.checkpoint.load);
      ctx.memo.started_from_save = first.ok() && f.train.checkpoint.load_optim &&
                                   std::filesystem::equivalent(first->dir(), there->dir(), ec);
    }
  }
  AttemptPlan plan{.index = 0,
                   .parallel = par,
                   .job = *std::move(job),
                   .load = f.train.checkpoint.load,
                   .load_optim = f.train.checkpoint.load_optim,
                   .failed_at = std::nullopt};
  for (;;) {
    Outcome out = run_attempt(ctx, plan);
    if (out.code == 0) {
      ctx.progress->finish();
      break;
    }
    if (!out.restartable || plan.index >= f.max_restarts || ctx.interrupted.load() != 0) {
      ctx.progress->finish();
      (void)write_trace_metrics(f.train, *ctx.progress);
      return fail(out.message, out.code);
    }
    int resume_step = 0;
    absl::StatusOr<AttemptPlan> next = next_plan(f, ctx.options, ctx.memo, plan, out, &resume_step);
    if (!next.ok()) {
      return fail(absl::StrCat(out.message, "\n  no restart: ", next.status().message()), out.code);
    }
    const std::string cause = out.message.substr(0, out.message.find('\n'));
    std::printf("troupe launch: restart %d of %d after: %s\n  resuming from %s%s\n", next->index,
                f.max_restarts, cause.c_str(),
                resume_step > 0 ? absl::StrCat("step ", resume_step, " (", next->load, ")").c_str()
                                : "the start",
                next->parallel.dp != plan.parallel.dp
                    ? absl::StrCat(", now with --dp ", next->parallel.dp, " on ",
                                   next->job.hosts.size(), " host(s)")
                          .c_str()
                    : "");
    std::fflush(stdout);
    ctx.restarts.push_back({{"restart", next->index},
                            {"cause", cause},
                            {"resumed_from_step", resume_step},
                            {"dp", next->parallel.dp}});
    // The metrics of the steps after the checkpoint are run again.
    ctx.metrics.close();
    ctx.metrics.open(metrics_path, std::ios::trunc);
    if (ctx.user_metrics.is_open()) {
      ctx.user_metrics.close();
      ctx.user_metrics.open(f.train.metrics_jsonl, std::ios::trunc);
    }
    ctx.progress->rewind(resume_step, metric_streams());
    plan = *std::move(next);
  }
  if (absl::Status st = write_trace_metrics(f.train, *ctx.progress); !st.ok()) {
    return fail(absl::StrCat("--trace: ", st.message()));
  }
  if (!f.train.save_weights.empty())
    std::printf("saved weights to %s\n", f.train.save_weights.c_str());
  if (!f.train.trace.dir.empty()) {
    std::printf("trace: %s (read it with `troupe trace %s`)\n", f.train.trace.dir.c_str(),
                f.train.trace.dir.c_str());
  }
  std::printf("run directory: %s\n", ctx.run_dir.c_str());
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
  cmd->add_option("--run-dir", f->run_dir,
                  "Logs, launch.json, metrics (default runs/<date>-<time>)");
  cmd->add_option("--token-file", f->token_file,
                  "The job token's file (default: TROUPE_JOB_TOKEN, or a new random one)");
  cmd->add_option("--join-timeout", f->join_timeout_s, "Seconds for the job to assemble")
      ->capture_default_str();
  cmd->add_option("--max-restarts", f->max_restarts,
                  "When a rank or host fails, stop the job and start it again from the newest "
                  "checkpoint in --save, up to K times")
      ->capture_default_str();
  cmd->add_flag("--elastic", f->elastic,
                "A restart uses the hosts still reachable, with the largest --dp that fits "
                "(the checkpoint is resharded on load)");
  cmd->add_flag("--bind-cores", f->bind_cores,
                "Each worker on its share of its host's CPUs, by local rank: a block each, or "
                "one each in turn where workers outnumber them (as deepspeed "
                "--bind_cores_to_rank, mpirun --bind-to core)");
  return [f] { return run_launch(*f); };
}

Command add_agent_command(CLI::App& app) {
  auto o = std::make_shared<AgentOptions>();
  CLI::App* cmd = app.add_subcommand("agent", "The launcher's agent on a host (started by launch)");
  cmd->group("");  // not for people
  cmd->add_option("--master-addr", o->master_addr, "The launcher's address")->required();
  cmd->add_option("--master-port", o->master_port, "The launcher's agent port")->required();
  cmd->add_option("--index", o->index, "Which host of the job")->required();
  cmd->add_flag("--exit-signal-handler", o->survive_sigterm,
                "Outlive SIGTERM (the job saves, then ends)");
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
