#include "launcher/cpu_binding.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace troupe::launcher {
namespace {

// A CPU set for CPU numbers below n (CPU_ALLOC's; CPU_FREE is a macro).
struct FreeSet {
  void operator()(cpu_set_t* set) const { CPU_FREE(set); }
};
using CpuSet = std::unique_ptr<cpu_set_t, FreeSet>;

}  // namespace

std::vector<int> cpu_share(const std::vector<int>& allowed, int local_rank, int local_world) {
  const auto c = static_cast<long>(allowed.size());
  const long l = local_world, i = local_rank;
  if (l > c) return {allowed[static_cast<std::size_t>(i % c)]};
  return std::vector<int>(allowed.begin() + i * c / l, allowed.begin() + (i + 1) * c / l);
}

absl::StatusOr<std::vector<int>> allowed_cpus() {
  // (A set as large as the kernel's CPU numbers go: CPU_ALLOC, grown while
  // the kernel says it is too small.)
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    CpuSet set(CPU_ALLOC(n));
    const std::size_t bytes = CPU_ALLOC_SIZE(n);
    if (::sched_getaffinity(0, bytes, set.get()) != 0) {
      if (errno == EINVAL) continue;
      return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
    }
    std::vector<int> cpus;
    for (int cpu = 0; cpu < n; cpu++) {
      if (CPU_ISSET_S(cpu, bytes, set.get())) cpus.push_back(cpu);
    }
    return cpus;
  }
  return absl::InternalError("sched_getaffinity: more CPUs than 2^20");
}

absl::Status bind_process(const std::vector<int>& cpus) {
  int n = 1;
  for (int cpu : cpus) n = std::max(n, cpu + 1);
  CpuSet set(CPU_ALLOC(n));
  const std::size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, set.get());
  for (int cpu : cpus) CPU_SET_S(cpu, bytes, set.get());
  // This thread first (the one that starts the rest), then any other there
  // is already. (A thread gone meanwhile is ESRCH: nothing to bind.)
  if (::sched_setaffinity(0, bytes, set.get()) != 0) {
    return absl::InternalError(
        absl::StrCat("sched_setaffinity(", cpu_list(cpus), "): ", std::strerror(errno)));
  }
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return absl::OkStatus();
  absl::Status st;
  while (const dirent* e = ::readdir(dir)) {
    int tid = 0;
    if (!absl::SimpleAtoi(e->d_name, &tid)) continue;
    if (::sched_setaffinity(tid, bytes, set.get()) != 0 && errno != ESRCH && st.ok()) {
      st = absl::InternalError(absl::StrCat("sched_setaffinity(", cpu_list(cpus), ") of thread ",
                                            tid, ": ", std::strerror(errno)));
    }
  }
  ::closedir(dir);
  return st;
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

}  // namespace troupe::launcher
