// The launcher's pieces: flags, run directory, placement, signals.
#include "launcher/launch_support.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "model/atomic_file.h"

namespace troupe::launcher {

using json = nlohmann::json;

std::string self_exe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("troupe") : p.string();
}

std::vector<std::string> command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  for (std::string arg; std::getline(in, arg, '\0');) out.push_back(arg);
  return out;
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof(buf) - 1) == 0 ? std::string(buf) : std::string("localhost");
}

absl::StatusOr<std::string> make_run_dir(const std::string& given) {
  std::error_code ec;
  std::string dir = given;
  if (dir.empty()) {
    std::filesystem::create_directories("runs", ec);
    const std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
    dir = absl::StrCat("runs/", stamp);
    for (int k = 2; ::mkdir(dir.c_str(), 0755) != 0; k++) {
      if (errno != EEXIST) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot make ", dir, ": ", std::strerror(errno)));
      }
      dir = absl::StrCat("runs/", stamp, "-", k);
    }
  } else {
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("--run-dir ", dir, ": ", ec.message()));
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if ((absl::StartsWith(name, "rank-") || absl::StartsWith(name, "agent-")) &&
          absl::EndsWith(name, ".log")) {
        std::filesystem::remove(entry.path(), ec);
      }
    }
  }
  return std::filesystem::absolute(dir, ec).lexically_normal().string();
}

std::string log_tail(const std::string& path, std::size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> last;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    last.push_back(line.substr(0, 300));
    if (last.size() > lines) last.erase(last.begin());
  }
  std::string out;
  for (const std::string& l : last) absl::StrAppend(&out, "\n      | ", l);
  return out;
}

absl::Status write_json(const std::string& path, const json& j) {
  absl::StatusOr<model::AtomicFile> f = model::AtomicFile::create(path);
  if (!f.ok()) return f.status();
  if (absl::Status st = f->write(j.dump(2) + "\n"); !st.ok()) return st;
  return f->commit();
}

absl::StatusOr<std::optional<std::string>> read_job_token(const std::string& token_file) {
  std::string token;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in || !std::getline(in, token) || token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", token_file, ": cannot read a token from it"));
    }
    return token;
  }
  if (const char* env = std::getenv("TROUPE_JOB_TOKEN"); env != nullptr && *env) {
    return std::string(env);
  }
  return std::nullopt;
}

bool forwarded_var(absl::string_view kv) {
  for (const char* p : {"TROUPE_", "UCX_", "OMP_", "NCCL_", "CUDA_VISIBLE_DEVICES=", "OPENBLAS_"}) {
    if (absl::StartsWith(kv, p)) return true;
  }
  return false;
}

absl::StatusOr<Job> place(const LaunchFlags& f, int world) {
  Job job;
  absl::StatusOr<std::vector<HostEntry>> entries;
  if (!f.hostfile.empty() && !f.hosts.empty()) {
    return absl::InvalidArgumentError("give --hostfile or --hosts, not both");
  }
  const int per_node = f.nproc_per_node > 0 ? f.nproc_per_node : world;
  if (!f.hostfile.empty()) {
    entries = read_hostfile(f.hostfile);
    if (entries.ok() && f.nproc_per_node > 0) {
      for (HostEntry& e : *entries) e.slots = std::min(e.slots, f.nproc_per_node);
    }
    job.local = false;
  } else if (!f.hosts.empty()) {
    entries = hosts_from_list(f.hosts, per_node);
    job.local = false;
  } else {
    entries = std::vector<HostEntry>{{.host = "localhost", .slots = per_node, .line = 0}};
  }
  if (!entries.ok()) return entries.status();
  absl::StatusOr<std::vector<HostSlots>> slots = filter_slots(*entries, f.include, f.exclude);
  if (!slots.ok()) return slots.status();
  return place_on(*std::move(slots), world, job.local);
}

absl::StatusOr<Job> place_on(std::vector<HostSlots> slots, int world, bool local) {
  Job job;
  job.local = local;
  job.slots = std::move(slots);
  absl::StatusOr<std::vector<Placement>> placed = place_ranks(job.slots, world);
  if (!placed.ok()) return placed.status();
  job.placement = *std::move(placed);
  for (const Placement& p : job.placement) {
    if (std::find(job.hosts.begin(), job.hosts.end(), p.host) == job.hosts.end()) {
      job.hosts.push_back(p.host);
    }
  }
  return job;
}

sigset_t interrupt_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);  // not an interrupt: every rank writes its trace
  return set;
}

void block_interrupts() {
  const sigset_t set = interrupt_set();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace troupe::launcher
