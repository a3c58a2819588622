#include "launcher/cpu_binding.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace troupe::launcher {
namespace {

// A CPU set for CPU numbers below n (CPU_ALLOC's; CPU_FREE is a macro).
struct FreeSet {
  void operator()(cpu_set_t* set) const { CPU_FREE(set); }
};
using CpuSet = std::unique_ptr<cpu_set_t, FreeSet>;

absl::Status errno_error(const std::string& what) {
  const int err = errno;  // (before anything else may set it)
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

// The first line of a file, "" where it cannot be read.
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

int int_file(const std::string& path, int otherwise) {
  int n = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(first_line(path)), &n) ? n : otherwise;
}

// A cgroup hierarchy's file for this process: /proc/self/cgroup's line of
// the hierarchy (`0::` for v2, `N:cpuset:` for v1's cpuset), then the file
// in that cgroup's directory or the nearest parent that has it.
std::string cgroup_file(absl::string_view hierarchy, const std::string& mount,
                        const std::string& name) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const bool v2 = hierarchy.empty() && f[0] == "0" && f[1].empty();
    const std::vector<absl::string_view> controllers = absl::StrSplit(f[1], ',');
    const bool v1 = !hierarchy.empty() && std::find(controllers.begin(), controllers.end(),
                                                    hierarchy) != controllers.end();
    if (!v2 && !v1) continue;
    for (std::string dir = f[2];;) {
      const std::string path = absl::StrCat(mount, dir == "/" ? "" : dir, "/", name);
      if (!first_line(path).empty()) return path;
      const std::size_t up = dir.rfind('/');
      if (up == std::string::npos || dir == "/") break;
      dir = dir.substr(0, up);
    }
  }
  return "";
}

}  // namespace

std::vector<int> cpu_share(std::vector<Cpu> allowed, int local_rank, int local_world) {
  auto core_order = [](const Cpu& a, const Cpu& b) {
    return std::tie(a.package, a.core, a.id) < std::tie(b.package, b.core, b.id);
  };
  std::sort(allowed.begin(), allowed.end(), core_order);
  const auto c = static_cast<long>(allowed.size());
  const long l = local_world, i = local_rank;
  std::vector<int> out;
  if (l > c) {
    // Each core's k-th hardware thread (k from 0) after every core's k-1-th.
    std::map<std::pair<int, int>, int> seen;  // (package, core) -> threads so far
    std::vector<std::pair<int, Cpu>> spread;
    for (const Cpu& cpu : allowed) spread.emplace_back(seen[{cpu.package, cpu.core}]++, cpu);
    std::stable_sort(spread.begin(), spread.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    out.push_back(spread[static_cast<std::size_t>(i % c)].second.id);
  } else {
    for (long k = i * c / l; k < (i + 1) * c / l; k++) out.push_back(allowed[k].id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<int>> allowed_cpus() {
  // (A set as large as the kernel's CPU numbers go, grown while the kernel
  // says it is too small.)
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    CpuSet set(CPU_ALLOC(n));
    if (set == nullptr) return absl::ResourceExhaustedError("CPU_ALLOC: no memory");
    const std::size_t bytes = CPU_ALLOC_SIZE(n);
    if (::sched_getaffinity(0, bytes, set.get()) != 0) {
      if (errno == EINVAL) continue;
      return errno_error("sched_getaffinity");
    }
    std::vector<int> cpus;
    for (int cpu = 0; cpu < n; cpu++) {
      if (CPU_ISSET_S(cpu, bytes, set.get())) cpus.push_back(cpu);
    }
    return cpus;
  }
  return absl::InternalError("sched_getaffinity: more CPUs than 2^20");
}

std::vector<Cpu> cpu_topology(const std::vector<int>& ids) {
  std::vector<Cpu> out;
  for (int id : ids) {
    const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", id, "/topology/");
    out.push_back({.id = id,
                   .package = int_file(dir + "physical_package_id", 0),
                   .core = int_file(dir + "core_id", id)});
  }
  return out;
}

std::vector<int> cgroup_cpus() {
  for (const std::string& path :
       {cgroup_file("", "/sys/fs/cgroup", "cpuset.cpus.effective"),
        cgroup_file("cpuset", "/sys/fs/cgroup/cpuset", "cpuset.effective_cpus")}) {
    if (path.empty()) continue;
    absl::StatusOr<std::vector<int>> cpus = parse_cpu_list(first_line(path));
    if (cpus.ok() && !cpus->empty()) return *cpus;
  }
  return {};
}

absl::Status bind_process(const std::vector<int>& cpus) {
  int n = 1;
  for (int cpu : cpus) n = std::max(n, cpu + 1);
  CpuSet set(CPU_ALLOC(n));
  if (set == nullptr) return absl::ResourceExhaustedError("CPU_ALLOC: no memory");
  const std::size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, set.get());
  for (int cpu : cpus) CPU_SET_S(cpu, bytes, set.get());
  const std::string list = cpu_list(cpus);
  if (::sched_setaffinity(0, bytes, set.get()) != 0) {
    return errno_error(absl::StrCat("sched_setaffinity(", list, ")"));
  }
  // (A thread gone meanwhile is ESRCH: nothing to bind.)
  std::set<int> bound;
  for (bool more = true; more;) {
    more = false;
    DIR* dir = ::opendir("/proc/self/task");
    if (dir == nullptr) return errno_error("/proc/self/task");
    absl::Status st;
    while (const dirent* e = ::readdir(dir)) {
      int tid = 0;
      if (!absl::SimpleAtoi(e->d_name, &tid) || !bound.insert(tid).second) continue;
      more = true;
      if (::sched_setaffinity(tid, bytes, set.get()) != 0 && errno != ESRCH && st.ok()) {
        st = errno_error(absl::StrCat("sched_setaffinity(", list, ") of thread ", tid));
      }
    }
    ::closedir(dir);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) j++;
    absl::StrAppend(&out, out.empty() ? "" : ",", cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<std::vector<int>> parse_cpu_list(absl::string_view text) {
  std::set<int> cpus;
  text = absl::StripAsciiWhitespace(text);
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(ends[0], &lo) || lo < 0 ||
        !absl::SimpleAtoi(ends.size() == 2 ? ends[1] : ends[0], &hi) || hi < lo ||
        hi - lo >= (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a CPU list"));
    }
    for (int cpu = lo; cpu <= hi; cpu++) cpus.insert(cpu);
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

}  // namespace troupe::launcher
