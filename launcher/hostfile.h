// Where a job's ranks run: DeepSpeed's hostfile ("host slots=N" per line,
// '#' comments), its --include/--exclude filters (NODE[:SLOT[,SLOT...]]
// joined by '@'), and the placement of ranks on the slots that are left, in
// Megatron's rank order (consecutive ranks, and so a tensor-parallel group,
// on one host).
//
//   auto hosts = launcher::read_hostfile("hostfile");          // StatusOr
//   auto slots = launcher::filter_slots(*hosts, "", "worker-1:0");
//   auto where = launcher::place_ranks(*slots, /*world=*/16);  // rank -> (host, local rank)
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe::launcher {

// Ranks one host may run (a GPU node has 8 or 16; a CPU host one per core
// group): a bound, so that a wrong hostfile cannot make us allocate slots by
// the billion.
constexpr int kMaxSlotsPerHost = 4096;

struct HostEntry {
  std::string host;
  int slots = 0;
  int line = 0;  // where the hostfile says so
};

// The hosts of a hostfile's text, in file order. Errors name `source`
// (the file) and the line: a line that is not "HOST slots=N" (an optional
// trailing '#' comment allowed), N not a positive integer, a host listed
// twice.
absl::StatusOr<std::vector<HostEntry>> parse_hostfile(absl::string_view text,
                                                      absl::string_view source);
absl::StatusOr<std::vector<HostEntry>> read_hostfile(const std::string& path);
// "h1,h2" (--hosts): one slot each unless `slots_per_host` says otherwise.
absl::StatusOr<std::vector<HostEntry>> hosts_from_list(absl::string_view list, int slots_per_host);

struct HostSlots {
  std::string host;
  std::vector<int> slots;  // usable slot indices, ascending as given
};

// DeepSpeed's resource filter: `include` keeps only what it names (a host
// alone: all its slots), `exclude` removes what it names; not both. Hosts
// keep the hostfile's order; hosts left without slots are dropped.
absl::StatusOr<std::vector<HostSlots>> filter_slots(const std::vector<HostEntry>& hosts,
                                                    absl::string_view include,
                                                    absl::string_view exclude);

struct Placement {
  int rank;
  std::string host;
  int local_rank;  // index among this host's ranks
  int slot;        // the slot it uses (a GPU index on GPU hosts)
};

// Ranks 0..world-1 over the slots in order: the first host's slots first.
// Fewer slots than ranks is an error that says how many of each.
absl::StatusOr<std::vector<Placement>> place_ranks(const std::vector<HostSlots>& hosts, int world);

}  // namespace troupe::launcher
