// Where a `troupe worker` stands in its job when an engine the cluster
// already runs started it, not our launcher: srun (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST), mpirun
// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK), or torchrun and the
// Kubernetes training operators (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT). The most specific wins: torchrun's variables, then
// OpenMPI's, then SLURM's (a torchrun or mpirun inside a SLURM allocation
// also sees SLURM's, which then describe the outer task).
//
//   auto where = launcher::world_from_env(::getenv, {.master_addr = flag_addr});
//   if (where.ok() && *where) run_rank((*where)->rank, (*where)->world, ...);
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe::launcher {

struct WorldPosition {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;  // where rank 0 (the coordinator's process) listens
  int master_port = 0;
  std::string engine;  // "torchrun", "OpenMPI" or "SLURM": for messages
};

struct MasterFlags {
  std::string master_addr;  // --master-addr ("" if not given)
  int master_port = 0;      // --master-port (0 if not given)
};
constexpr int kDefaultMasterPort = 29500;  // torchrun's

using GetEnv = std::function<const char*(const char*)>;
// nullopt when no engine's variables are set; an error naming the variable
// when they are set but wrong (not a number, rank outside the world, no
// master address anywhere).
absl::StatusOr<std::optional<WorldPosition>> world_from_env(const GetEnv& getenv,
                                                            const MasterFlags& flags);

// How many of the job's workers share this host, as the engine says:
// LOCAL_WORLD_SIZE (torchrun, troupe launch), OMPI_COMM_WORLD_LOCAL_SIZE,
// this node's entry (by SLURM_NODEID) of SLURM_STEP_TASKS_PER_NODE or
// SLURM_TASKS_PER_NODE ("4(x2),3": four on each of the first two nodes,
// three on the third), or SLURM_NTASKS_PER_NODE; 1 where none says (or
// says nonsense).
int local_world_from_env(const GetEnv& getenv);

// This worker's place among its host's workers, and how many they are,
// from one engine's variables: LOCAL_RANK and LOCAL_WORLD_SIZE (torchrun,
// troupe launch), OMPI_COMM_WORLD_LOCAL_RANK and _LOCAL_SIZE, or
// SLURM_LOCALID and this node's tasks (as local_world_from_env reads them);
// the first engine whose rank is set. nullopt where none is; an error naming
// the variables where the rank is set and its count is not, either is not a
// number, or the rank is not below the count.
struct LocalPosition {
  int rank = 0, workers = 1;
  std::string from;  // the variables, for messages
};
absl::StatusOr<std::optional<LocalPosition>> local_position_from_env(const GetEnv& getenv);

// What says all `world` workers of the job run on this host, as
// "VARIABLE=value": LOCAL_WORLD_SIZE or OMPI_COMM_WORLD_LOCAL_SIZE equal to
// `world` (the first of them that is set decides), else
// SLURM_STEP_NUM_NODES or SLURM_NNODES 1. Empty where none says so (the
// UCX transport then keeps TCP).
std::string world_on_this_host(const GetEnv& getenv, int world);

// SLURM's host list syntax ("node[01-03,7],gpu-a[1-2]-x"): the hosts in
// order, zero padding kept. An error for unbalanced brackets, a bad range
// or a list of more than `max_hosts`.
absl::StatusOr<std::vector<std::string>> expand_slurm_hostlist(absl::string_view list,
                                                               std::size_t max_hosts = 1 << 16);

}  // namespace troupe::launcher
