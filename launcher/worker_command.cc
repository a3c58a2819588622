// `troupe worker`: one rank of a job in this process (actors/runtime/worker.h).
//
// Where it stands in the job comes from --rank/--world (what `troupe
// launch` and its agents pass), or from the variables of the engine that
// started it: srun, mpirun, torchrun and the Kubernetes operators
// (launcher/world_env.h). Then rank 0's process also hosts the coordinator
// (actors/runtime/coordinator_host.h), prints the progress and writes the metrics.
//
// The job token comes from standard input (TROUPE_TOKEN_STDIN=1: the
// launcher's way), --token-file or TROUPE_JOB_TOKEN; never the command line.
//
// Exit codes (launcher/exit_codes.h): kExitOk, the run succeeded;
// kExitStopped, the job stopped for another rank's failure (or an
// interrupt); kExitFailed, this rank failed or lost the coordinator.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "actors/runtime/coordinator_host.h"
#include "actors/runtime/worker.h"
#include "api/train_flags.h"
#include "comm/auth.h"
#include "launcher/commands.h"
#include "launcher/cpu_binding.h"
#include "launcher/exit_codes.h"
#include "launcher/launch_support.h"
#include "launcher/trace_signal.h"
#include "launcher/world_env.h"

namespace troupe::launcher {
namespace {

struct WorkerFlags {
  TrainFlags train;
  int rank = -1, world = -1;
  std::string master_addr;
  int master_port = 0;
  std::string token_file;
  std::string control_socket;
  double join_timeout_s = 120;
  bool bind_cores = false;  // --bind-cores: this worker on its share of the host's CPUs
};

// The job token: stdin (from the launcher), --token-file, TROUPE_JOB_TOKEN.
absl::StatusOr<std::string> read_token(const std::string& token_file) {
  std::string token;
  const char* on_stdin = std::getenv("TROUPE_TOKEN_STDIN");
  if (on_stdin != nullptr && std::string(on_stdin) == "1") {
    std::getline(std::cin, token);
  } else if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in)
      return absl::InvalidArgumentError(absl::StrCat("--token-file ", token_file, ": cannot read"));
    std::getline(in, token);
  } else if (const char* env = std::getenv("TROUPE_JOB_TOKEN"); env != nullptr) {
    token = env;
  }
  token = std::string(absl::StripAsciiWhitespace(token));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        "no job token: give --token-file FILE or set TROUPE_JOB_TOKEN (with mpirun: -x "
        "TROUPE_JOB_TOKEN) to the same secret on every rank");
  }
  if (token.size() < comm::kMinTokenLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job token is ", token.size(), " characters; it must have at least ",
                     comm::kMinTokenLength, " (e.g. `openssl rand -hex 32`)"));
  }
  return token;
}

// How many workers share this host, as the engine says (1 if it does not).
int local_workers() { return local_world_from_env(::getenv); }

// --bind-cores: this process, every thread it has and will start, on its
// local rank's share of the CPUs it may use (launcher/cpu_binding.h); the
// share. A process that may use fewer CPUs than its cgroup, under an engine
// (`engine`), was perhaps bound by it already (srun's --cpu-bind, mpirun's
// --bind-to), each task to CPUs of its own: its share is then a part of
// that task's, which a warning says (a taskset or numactl over the whole
// job narrows every task alike, and the share is right).
absl::StatusOr<std::vector<int>> bind_cores(int rank, bool engine) {
  absl::StatusOr<std::optional<LocalPosition>> local = local_position_from_env(::getenv);
  if (!local.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--bind-cores: ", local.status().message()));
  }
  if (!local->has_value()) {
    return absl::InvalidArgumentError(
        "--bind-cores: no LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID says which of "
        "this host's workers this is");
  }
  absl::StatusOr<std::vector<int>> allowed = allowed_cpus();
  if (!allowed.ok()) {
    return absl::Status(allowed.status().code(),
                        absl::StrCat("--bind-cores: ", allowed.status().message()));
  }
  if (allowed->empty()) return absl::InternalError("--bind-cores: this process may use no CPU");
  if (const std::vector<int> cgroup = cgroup_cpus();
      engine && !cgroup.empty() && allowed->size() < cgroup.size()) {
    std::fprintf(stderr,
                 "troupe worker: warning: --bind-cores: this process may use CPU %s of its "
                 "cgroup's %s: if srun or mpirun bound each task to CPUs of its own, each "
                 "worker takes a part of its task's (start them with srun --cpu-bind=none or "
                 "mpirun --bind-to none)\n",
                 cpu_list(*allowed).c_str(), cpu_list(cgroup).c_str());
  }
  const LocalPosition& l = **local;
  const std::vector<int> mine = cpu_share(cpu_topology(*allowed), l.rank, l.workers);
  if (absl::Status st = bind_process(mine); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("--bind-cores: ", st.message()));
  }
  std::fprintf(stderr, "troupe worker: rank %d bound to CPU %s (local rank %d of %d on CPU %s)\n",
               rank, cpu_list(mine).c_str(), l.rank, l.workers, cpu_list(*allowed).c_str());
  return mine;
}

int run(WorkerFlags& f) {
  auto fail = [](const absl::Status& st, int code = 1) {
    std::fprintf(stderr, "troupe worker: error: %s\n", std::string(st.message()).c_str());
    return code;
  };
  // (Every rank resolves its own default device; the coordinator checks they agree.)
  absl::StatusOr<PreparedRun> run =
      prepare_run(f.train, {.runner = Runner::kWorker, .workers_here = local_workers()});
  if (!run.ok()) return fail(run.status());
  if (!run->device_why.empty()) {
    std::fprintf(stderr, "troupe worker: device: %s\n", run->device_why.c_str());
  }
  const actors::ParallelOptions& par = f.train.parallel;
  bool engine = false;
  int local_rank = -1;  // (from our launcher: LOCAL_RANK)
  if (f.rank < 0) {     // not from our launcher: the engine's variables
    absl::StatusOr<std::optional<WorldPosition>> where =
        world_from_env(::getenv, {.master_addr = f.master_addr, .master_port = f.master_port});
    if (!where.ok()) return fail(where.status());
    if (!*where) {
      return fail(absl::InvalidArgumentError(
          "no --rank/--world, and no srun, mpirun or torchrun variables: start workers with "
          "`troupe launch`, or give --rank and --world"));
    }
    f.rank = (*where)->rank;
    f.world = (*where)->world;
    f.master_addr = (*where)->master_addr;
    f.master_port = (*where)->master_port;
    local_rank = (*where)->local_rank;
    engine = true;
    std::fprintf(stderr, "troupe worker: rank %d of %d (from %s), coordinator at %s:%d\n", f.rank,
                 f.world, (*where)->engine.c_str(), f.master_addr.c_str(), f.master_port);
  }
  // (Before the actors, the transport and the streams start their threads;
  // any there are already, as a CUDA driver's, are bound too.)
  std::vector<int> share;
  if (f.bind_cores) {
    absl::StatusOr<std::vector<int>> bound = bind_cores(f.rank, engine);
    if (!bound.ok()) return fail(bound.status());
    share = *std::move(bound);
  }
  if (f.world != par.world()) {
    return fail(absl::InvalidArgumentError(absl::StrCat("the job has ", f.world, " ranks but --tp ",
                                                        par.tp, " x --pp ", par.pp, " x --dp ",
                                                        par.dp, " = ", par.world())));
  }
  if (f.rank < 0 || f.rank >= f.world) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--rank ", f.rank, " outside the world of ", f.world)));
  }
  if (f.master_addr.empty() || f.master_port <= 0) {
    return fail(absl::InvalidArgumentError("--master-addr and --master-port are needed"));
  }
  absl::StatusOr<std::string> token = read_token(f.token_file);
  if (!token.ok()) return fail(token.status());
  const model::ckpt::Checkpoint* load = run->load.has_value() ? &*run->load : nullptr;
  // This rank's device (with --device cuda, its local rank's GPU), for the run.
  absl::StatusOr<api::RunDevice> device = api::open_device(f.train, local_rank,
                                                           /*process_per_rank=*/true);
  if (!device.ok()) return fail(device.status());
  f.train.parallel.device = device->device;
  const actors::CheckpointOptions& ck = f.train.checkpoint;
  // (Under SLURM every process of the job hears SIGTERM: a worker goes on
  // until the coordinator has saved and ends the run.)
  if (ck.exit_signal_handler) install_exit_signal_handler();
  model::TrainOptions o = run->options;
  o.model = par.sliced_config(o.model);
  const absl::Duration join = absl::Seconds(f.join_timeout_s);

  // Under an engine, rank 0's process hosts the coordinator.
  std::unique_ptr<actors::CoordinatorHost> host;
  std::thread coordinating;
  absl::Status run_status;
  std::ofstream metrics;
  if (engine && f.rank == 0) {
    if (!f.train.metrics_jsonl.empty()) {
      metrics.open(f.train.metrics_jsonl, std::ios::trunc);
      if (!metrics)
        return fail(absl::InvalidArgumentError(
            absl::StrCat("--metrics-jsonl ", f.train.metrics_jsonl, ": cannot open for writing")));
    }
    absl::StatusOr<std::unique_ptr<actors::CoordinatorHost>> h = actors::CoordinatorHost::listen(
        {.options = o,
         .parallel = par,
         .port = f.master_port,
         .token = *token,
         .join_timeout = join,
         .log =
             [](const std::string& line) {
               std::fprintf(stderr, "troupe worker: %s\n", line.c_str());
             },
         .checkpoints = {.flags = ck,
                         .loaded = load,
                         .exit_requested = ck.exit_signal_handler ? exit_signal_received : nullptr,
                         .log = [](const std::string& line) {
                           std::printf("%s\n", line.c_str());
                           std::fflush(stdout);
                         }}});
    if (!h.ok()) return fail(h.status());
    host = *std::move(h);
    coordinating = std::thread([&, steps = o.steps] {
      Progress progress(steps, metrics.is_open() ? &metrics : nullptr, f.train.log_interval);
      run_status = host->run([&](const model::StepMetrics& m) { progress.report(m); });
      progress.finish();
    });
  }
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // SIGUSR1: this rank's trace now (the launcher asks every rank by message).
  actors::DumpHook dump_hook;
  DumpOnSignal usr1([&dump_hook] { dump_hook.call(); });
  actors::WorkerOptions w{
      .spec = {.options = o,
               .parallel = par,
               .rank = f.rank,
               // (Bound: a thread a CPU of its share.)
               .threads = o.threads > 0    ? o.threads
                          : !share.empty() ? static_cast<int>(share.size())
                                           : std::max(1, cores / local_workers()),
               .factory = stage_factory(f.train),
               .load = load,
               .load_optimizer = ck.load_optim,
               .trace = f.train.trace},
      .master_addr = host ? "127.0.0.1" : f.master_addr,
      .master_port = host ? host->port() : f.master_port,
      .token = *token,
      .control = {.local_name = host ? host->local_name() : f.control_socket},
      .join_timeout = join,
      .save_weights = f.train.save_weights,
      .log = nullptr,
      .dump_hook = &dump_hook,
      .one_host = world_on_this_host(::getenv, par.world())};
  absl::Status st = actors::run_worker(w);
  if (host && !st.ok())
    host->cancel(absl::Status(st.code(), absl::StrCat("rank 0: ", st.message())));
  if (host) {
    coordinating.join();
    host.reset();
    if (!run_status.ok()) return fail(run_status, 1);
  }
  if (absl::IsAborted(st)) {
    // Another rank's failure or an interrupt: whoever started the job says
    // why (the reason is in this log, not repeated on the terminal).
    std::fprintf(stderr, "troupe worker: stopped: %s\n", std::string(st.message()).c_str());
    return kExitStopped;
  }
  if (!st.ok()) return fail(st, 1);
  if (f.rank == 0 && !f.train.save_weights.empty()) {
    std::printf("saved weights to %s\n", f.train.save_weights.c_str());
  }
  return 0;
}

}  // namespace

Command add_worker_command(CLI::App& app) {
  auto flags = std::make_shared<WorkerFlags>();
  CLI::App* cmd = app.add_subcommand(
      "worker", "Run one rank of a job (started by `troupe launch`, srun, mpirun or torchrun)");
  add_train_flags(cmd, flags->train);
  cmd->add_option("--rank", flags->rank, "This worker's global rank (default: from the engine)");
  cmd->add_option("--world", flags->world, "Ranks in the job (default: from the engine)");
  cmd->add_option("--master-addr", flags->master_addr,
                  "Where the coordinator listens (default: MASTER_ADDR, or SLURM's first host)");
  cmd->add_option("--master-port", flags->master_port, "The coordinator's port (default 29500)");
  cmd->add_option("--token-file", flags->token_file, "A file whose first line is the job token");
  cmd->add_option("--control-socket", flags->control_socket,
                  "The coordinator's local socket, where it runs on this host (troupe launch "
                  "passes it; without it, or where it fails, TCP)");
  cmd->add_option("--join-timeout", flags->join_timeout_s,
                  "Seconds to wait for the whole job to assemble")
      ->capture_default_str();
  cmd->add_flag("--bind-cores", flags->bind_cores,
                "Run on this worker's share of the CPUs it may use, by its local rank: a block "
                "each, or one each in turn where workers outnumber them");
  return [flags] { return run(*flags); };
}

}  // namespace troupe::launcher
