// `--bind-cores` (troupe launch, troupe worker): each worker process of a
// host runs on a share of the CPUs it may use, as `deepspeed
// --bind_cores_to_rank`, `mpirun --bind-to core` and `srun --cpu-bind` do.
// The share of local rank i of L workers, of the C CPUs this process may
// run on (sched_getaffinity: a cgroup's or taskset's set, in the kernel's
// numbering, hardware threads each):
//   L <= C: a block, CPUs [i*C/L, (i+1)*C/L) of the set in order;
//   L >  C: one CPU, the (i mod C)th, so that neighbouring ranks (a
//           pipeline's adjacent stages) go to different CPUs.
// A bound process's threads (its CAF worker, stream, transport and control
// threads) share its CPUs' caches and wake each other without waking
// another CPU; on a 2-core VM at pp 8, 8 workers bound in turn made a
// zero-cost step about a fifth shorter (docs/RUNTIME_COST.md).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::launcher {

// The share above; `allowed` sorted, not empty; 0 <= local_rank < local_world.
std::vector<int> cpu_share(const std::vector<int>& allowed, int local_rank, int local_world);

// The CPUs this process may run on, sorted.
absl::StatusOr<std::vector<int>> allowed_cpus();

// Binds every thread of this process (each task of /proc/self/task) to
// `cpus`; threads started later inherit it.
absl::Status bind_process(const std::vector<int>& cpus);

// "0-3,8,10-11".
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace troupe::launcher
