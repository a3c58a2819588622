// One start's worker command lines and launch record (launcher/launch_workers.h).
#include "launcher/launch_workers.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/process.h"

namespace troupe::launcher {
namespace {

// The worker's command line: the training flags as given, but the layout
// and the checkpoint to load as this start's plan says.
std::vector<std::string> worker_flags(const LaunchFlags& f, const AttemptPlan& plan) {
  std::vector<std::string> out =
      forwarded_train_flags(f.train, {"--metrics-jsonl", "--dp", "--load", "--no-load-optim",
                                      "--trace", "--flight-dir", "--device"});
  out.insert(out.end(), {"--dp", std::to_string(plan.parallel.dp)});
  // (Given, or this host's default for a job on this host alone; else
  // each worker resolves its own.)
  if (!f.train.device.empty()) out.insert(out.end(), {"--device", f.train.device});
  // (Absolute: a worker may run in another directory.)
  if (!f.train.trace.dir.empty()) out.insert(out.end(), {"--trace", f.train.trace.dir});
  out.insert(out.end(), {"--flight-dir", flight_dir(f, plan.index)});
  if (!plan.load.empty()) out.insert(out.end(), {"--load", plan.load});
  if (!plan.load.empty() && !plan.load_optim) out.push_back("--no-load-optim");
  if (f.bind_cores) out.push_back("--bind-cores");
  return out;
}

// What the table says a worker opens: with --device cuda, its local rank's
// GPU; on other hosts without --device, the default there.
std::string device_column(const std::string& device, int local_rank) {
  if (device == "cuda") return absl::StrCat("cuda:", local_rank);
  if (device == "opaque") return "cpu (opaque)";
  if (device == "cpu") return "cpu";
  return "its host's default";
}

}  // namespace

std::string flight_dir(const LaunchFlags& f, int index) {
  return index == 0 ? f.train.trace.flight_dir
                    : absl::StrCat(f.train.trace.flight_dir, ".restart", index);
}

std::string failure_dir(const LaunchFlags& f, int index) {
  return f.train.trace.dir.empty() ? flight_dir(f, index) : f.train.trace.dir;
}

WorkerLaunches worker_launches(const WorkerLaunchArgs& a) {
  const LaunchFlags& f = a.f;
  const Job& job = a.plan.job;
  const model::TrainOptions& o = a.options;
  const comm::Layout layout = a.plan.parallel.layout();
  const int world = a.plan.parallel.world();
  std::map<std::string, int> per_host;
  for (const Placement& p : job.placement) per_host[p.host]++;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::vector<std::string> flags = worker_flags(f, a.plan);
  std::vector<std::string> env_base;
  if (!job.local) {
    for (const std::string& kv : current_environment()) {
      if (forwarded_var(kv)) env_base.push_back(kv);
    }
  }
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  const std::string attempt = a.plan.index == 0 ? "" : absl::StrCat(".restart", a.plan.index);
  WorkerLaunches out;
  for (const Placement& p : job.placement) {
    const comm::Coord c = layout.coord(p.rank);
    const int local = per_host[p.host];
    // (With --bind-cores and no --threads, each worker takes a thread a CPU
    // of its share, which it reads on its host: the table says "share".)
    const bool by_share = f.bind_cores && o.threads <= 0;
    const int threads = o.threads > 0 ? o.threads : std::max(1, cores / local);
    std::printf("  %5d  (%d,%d,%d)%*s  %-20s  %5d  %7s  %s\n", p.rank, c.d, c.s, c.t,
                static_cast<int>(9 - absl::StrFormat("(%d,%d,%d)", c.d, c.s, c.t).size()), "",
                p.host.c_str(), p.local_rank, by_share ? "share" : absl::StrCat(threads).c_str(),
                device_column(f.train.device, p.local_rank).c_str());
    WorkerLaunch w{.rank = p.rank, .host = p.host};
    w.argv = {self_exe(), "worker"};
    w.argv.insert(w.argv.end(), flags.begin(), flags.end());
    for (const std::string& arg :
         {std::string("--rank"), std::to_string(p.rank), std::string("--world"),
          std::to_string(world), std::string("--master-addr"), a.master,
          std::string("--master-port"), std::to_string(a.port), std::string("--join-timeout"),
          absl::StrCat(f.join_timeout_s)}) {
      w.argv.push_back(arg);
    }
    if (!a.local_socket.empty()) {
      w.argv.push_back("--control-socket");
      w.argv.push_back(a.local_socket);
    }
    if (o.threads <= 0 && !by_share) {
      w.argv.push_back("--threads");
      w.argv.push_back(std::to_string(threads));
    }
    w.env = env_base;
    w.env.push_back("TROUPE_TOKEN_STDIN=1");
    w.env.push_back(absl::StrCat("LOCAL_RANK=", p.local_rank));
    w.env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", local));
    w.log = absl::StrFormat("%s/rank-%05d%s.log", a.run_dir, p.rank, attempt);
    w.cwd = cwd;
    out.logs.emplace_back(absl::StrFormat("rank %d (%d,%d,%d) %s", p.rank, c.d, c.s, c.t, p.host),
                          w.log);
    out.launches.push_back(std::move(w));
  }
  return out;
}

nlohmann::json launch_record(const AttemptPlan& plan, const WorkerLaunches& w,
                             const std::string& coordinator, const nlohmann::json& restarts) {
  const actors::ParallelOptions& par = plan.parallel;
  const comm::Layout layout = par.layout();
  nlohmann::json record = {{"command", command_line()},
                           {"hosts", plan.job.hosts},
                           {"world", par.world()},
                           {"layout", {{"tp", par.tp}, {"pp", par.pp}, {"dp", par.dp}}},
                           {"coordinator", coordinator},
                           {"restarts", restarts},
                           {"ranks", nlohmann::json::array()}};
  for (const Placement& p : plan.job.placement) {
    const comm::Coord c = layout.coord(p.rank);
    const WorkerLaunch& launch = w.launches[static_cast<std::size_t>(p.rank)];
    record["ranks"].push_back({{"rank", p.rank},
                               {"d", c.d},
                               {"s", c.s},
                               {"t", c.t},
                               {"host", p.host},
                               {"local_rank", p.local_rank},
                               {"pid", nullptr},
                               {"log", launch.log},
                               {"argv", launch.argv}});
  }
  return record;
}

}  // namespace troupe::launcher
