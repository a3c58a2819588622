#include "launcher/cpu_binding.h"

#include <dirent.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
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

namespace {

// A field of /proc/self/mountinfo, its octal escapes (\040 for a space)
// undone.
std::string unescape_mount_field(absl::string_view field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); i++) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' && field[i + 1] <= '3' &&
        field[i + 2] >= '0' && field[i + 2] <= '7' && field[i + 3] >= '0' && field[i + 3] <= '7') {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                      (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

// A line of /proc/self/mountinfo: "ID PARENT MAJ:MIN ROOT MOUNTPOINT
// OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS", one space between
// fields (SOURCE may be empty).
struct Mount {
  std::string device, root, point;
  absl::string_view fstype, super;
};

std::vector<Mount> parse_mountinfo(absl::string_view mountinfo) {
  std::vector<Mount> out;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (dash - f.begin() < 6 || f.end() - dash < 4) continue;
    out.push_back({.device = std::string(f[2]),
                   .root = unescape_mount_field(f[3]),
                   .point = unescape_mount_field(f[4]),
                   .fstype = dash[1],
                   .super = dash[3]});
  }
  return out;
}

}  // namespace

std::vector<CgroupDir> cgroup_cpuset_dirs(
    absl::string_view mountinfo, absl::string_view proc_cgroup,
    const std::function<std::string(const std::string&)>& device_of) {
  // This process's cgroup in each hierarchy: "0::/path" (v2),
  // "N:cpuset[,...]:/path" (v1's cpuset).
  std::string v2_path, v1_path;
  bool has_v2 = false, has_v1 = false;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const std::vector<absl::string_view> controllers = absl::StrSplit(f[1], ',');
    if (f[0] == "0" && f[1].empty()) {
      v2_path = std::string(f[2]);
      has_v2 = true;
    } else if (std::find(controllers.begin(), controllers.end(), "cpuset") != controllers.end()) {
      v1_path = std::string(f[2]);
      has_v1 = true;
    }
  }
  // A mount shows its hierarchy from ROOT down: a cgroup outside it is not
  // in that mount, nor is one outside this process's cgroup namespace
  // ("/.." first, as the kernel writes it). A mount that another hides
  // (mounted over it or over a directory above it) is not what its path
  // reaches: the device there is not the line's. Two mounts of one
  // hierarchy (one device) on one point: the later line, the one mounted
  // on top unless propagation put it beneath.
  std::vector<CgroupDir> v2, v1;
  auto add = [](std::vector<CgroupDir>& to, CgroupDir d) {
    std::erase_if(to, [&](const CgroupDir& o) { return o.mount == d.mount; });
    to.push_back(std::move(d));
  };
  for (const Mount& m : parse_mountinfo(mountinfo)) {
    const bool is_v2 = m.fstype == "cgroup2" && has_v2;
    bool is_v1 = false;
    if (m.fstype == "cgroup" && has_v1) {
      const std::vector<absl::string_view> opts = absl::StrSplit(m.super, ',');
      is_v1 = std::find(opts.begin(), opts.end(), "cpuset") != opts.end();
    }
    if (!is_v2 && !is_v1) continue;
    const std::string& path = is_v2 ? v2_path : v1_path;
    std::string below;  // the cgroup's path under the mount's root
    if (path == "/.." || absl::StartsWith(path, "/../")) {
      continue;
    } else if (m.root == "/") {
      below = path == "/" ? "" : path;
    } else if (path == m.root) {
      below = "";
    } else if (absl::StartsWith(path, m.root + "/")) {
      below = path.substr(m.root.size());
    } else {
      continue;
    }
    if (device_of(m.point) != m.device) continue;
    add(is_v2 ? v2 : v1, {.mount = m.point,
                          .dir = m.point + below,
                          .file = is_v2 ? "cpuset.cpus.effective" : "cpuset.effective_cpus"});
  }
  v2.insert(v2.end(), v1.begin(), v1.end());
  return v2;
}

std::vector<int> cgroup_cpus(absl::string_view mountinfo, absl::string_view proc_cgroup,
                             const std::function<std::string(const std::string&)>& device_of,
                             const std::function<std::string(const std::string&)>& read_line) {
  for (const CgroupDir& d : cgroup_cpuset_dirs(mountinfo, proc_cgroup, device_of)) {
    // The cgroup's own file, or the nearest parent's that has one (up to
    // the mount: a v2 cgroup without the cpuset controller has none).
    for (std::string dir = d.dir;;) {
      const std::string line = read_line(absl::StrCat(dir, "/", d.file));
      if (!line.empty()) {
        absl::StatusOr<std::vector<int>> cpus = parse_cpu_list(line);
        if (cpus.ok() && !cpus->empty()) return *cpus;
      }
      const std::size_t up = dir.rfind('/');
      if (dir.size() <= d.mount.size() || up == std::string::npos || up < d.mount.size()) break;
      dir = dir.substr(0, up);
    }
  }
  return {};
}

std::string device_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(major(st.st_dev), ":", minor(st.st_dev));
}

std::vector<int> cgroup_cpus() {
  std::string mountinfo, proc_cgroup;
  {
    std::ifstream a("/proc/self/mountinfo"), b("/proc/self/cgroup");
    mountinfo.assign(std::istreambuf_iterator<char>(a), std::istreambuf_iterator<char>());
    proc_cgroup.assign(std::istreambuf_iterator<char>(b), std::istreambuf_iterator<char>());
  }
  return cgroup_cpus(mountinfo, proc_cgroup, device_of, first_line);
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
