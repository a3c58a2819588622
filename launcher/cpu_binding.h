// `--bind-cores` (troupe launch, troupe worker): each worker process of a
// host runs on a share of the CPUs it may use, as `deepspeed
// --bind_cores_to_rank` and `srun --cpu-bind=cores` do. The share of local
// rank i of L workers, of the C CPUs this process may run on
// (sched_getaffinity: a cgroup's or taskset's set; a CPU is a hardware
// thread), the CPUs ordered by package, then core, so that a core's
// hardware threads are neighbours:
//   L <= C: a block, the CPUs [i*C/L, (i+1)*C/L) of that order (whole cores
//           where C/L is a multiple of the threads a core);
//   L >  C: one CPU, the (i mod C)th in the order that takes each core's
//           first hardware thread before any core's second, so that local
//           ranks next to each other go to different cores (in Megatron's
//           rank order, t fastest, then d, then s: at tp 1 and dp 1 a
//           pipeline's neighbouring stages).
// A process bound to one CPU hands off between its threads (its CAF
// worker, stream, UCX progress and control threads) without waking
// another CPU: on a 2-core VM the slope over pp 1-8 of a zero-cost step
// across processes fell by 19-21 us a hop (to 56.4-73.2) in runs that
// toggled the binding (`scripts/bench bind`; docs/RUNTIME_COST.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe::launcher {

struct Cpu {
  int id = 0;       // the kernel's number
  int package = 0;  // /sys/devices/system/cpu/cpuN/topology/physical_package_id
  int core = 0;     // .../core_id (within the package)
};

// The share above, as the kernel's numbers, sorted; `allowed` not empty;
// 0 <= local_rank < local_world.
std::vector<int> cpu_share(std::vector<Cpu> allowed, int local_rank, int local_world);

// The CPUs this process may run on, sorted.
absl::StatusOr<std::vector<int>> allowed_cpus();
// Their packages and cores from sysfs (where it has none: one package, a
// core a CPU).
std::vector<Cpu> cpu_topology(const std::vector<int>& ids);
// The CPUs this process's cgroup may use (its cpuset's effective CPUs, in
// its cgroup's directory or the nearest parent's, wherever
// /proc/self/mountinfo has the hierarchy mounted; v2 first, then v1's
// cpuset): what an engine's binding of each task narrows. Empty where none
// can be read.
std::vector<int> cgroup_cpus();

// Where to look, from the texts of /proc/self/mountinfo and
// /proc/self/cgroup: for each mount of the cgroup v2 hierarchy, then of
// v1's cpuset, that shows this process's cgroup, its directory there and
// the file that holds the effective CPUs. A mount that another hides is
// left out: `device_of` (a path's device as mountinfo writes it, "MAJ:MIN";
// "" where it cannot be read) differs there from the mount's line.
struct CgroupDir {
  std::string mount;  // the mount point: the walk up stops there
  std::string dir;    // this process's cgroup under it
  std::string file;   // cpuset.cpus.effective (v2), cpuset.effective_cpus (v1)
};
std::vector<CgroupDir> cgroup_cpuset_dirs(
    absl::string_view mountinfo, absl::string_view proc_cgroup,
    const std::function<std::string(const std::string&)>& device_of);
// cgroup_cpus() from those texts, `read_line` giving a file's first line
// ("" where it cannot be read).
std::vector<int> cgroup_cpus(absl::string_view mountinfo, absl::string_view proc_cgroup,
                             const std::function<std::string(const std::string&)>& device_of,
                             const std::function<std::string(const std::string&)>& read_line);
// A path's device, "MAJ:MIN" (stat), "" where it cannot be read.
std::string device_of(const std::string& path);

// Binds every thread of this process to `cpus`: this one, then each task
// of /proc/self/task until a pass finds none new (a thread started by one
// not yet bound). Threads started later inherit it.
absl::Status bind_process(const std::vector<int>& cpus);

// "0-3,8,10-11", and back (InvalidArgument naming the text if it is not a
// list).
std::string cpu_list(const std::vector<int>& cpus);
absl::StatusOr<std::vector<int>> parse_cpu_list(absl::string_view text);

}  // namespace troupe::launcher
