// Fuzzes SLURM host-list expansion and the job position read from engine
// variables (launcher/world_env.h). The input is the value of
// SLURM_JOB_NODELIST, then (after a NUL) of SLURM_PROCID and SLURM_NTASKS.
//
// Checks: an expanded list has no empty host and at most the limit; a
// position that is accepted has 0 <= rank < world and a master address.
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/str_split.h"
#include "fuzz/fuzz_util.h"
#include "launcher/world_env.h"

using namespace troupe::launcher;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts = absl::StrSplit(input, absl::MaxSplits('\0', 2));
  parts.resize(3);
  auto hosts = expand_slurm_hostlist(parts[0], 4096);
  if (hosts.ok()) {
    FUZZ_CHECK(hosts->size() <= 4096);
    for (const std::string& h : *hosts) FUZZ_CHECK(!h.empty());
  }
  std::map<std::string, std::string> vars = {
      {"SLURM_JOB_NODELIST", parts[0]}, {"SLURM_PROCID", parts[1]}, {"SLURM_NTASKS", parts[2]}};
  auto getenv = [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() || it->second.find('\0') != std::string::npos ? nullptr
                                                                          : it->second.c_str();
  };
  auto p = world_from_env(getenv, {});
  if (p.ok() && p->has_value()) {
    FUZZ_CHECK((*p)->rank >= 0 && (*p)->rank < (*p)->world);
    FUZZ_CHECK(!(*p)->master_addr.empty());
  }
  return 0;
}
