// Fuzzes the hostfile parser and DeepSpeed's --include/--exclude filters
// (launcher/hostfile.h). The input is "HOSTFILE\0INCLUDE\0EXCLUDE" (missing
// parts are empty).
//
// Checks: a rejected hostfile's error names the file; an accepted one has
// hosts with names and at least one slot, and prints back ("HOST slots=N")
// to a file that parses to the same hosts; a filter keeps slots in range,
// each once, hosts in the file's order; placing as many ranks as there are
// slots succeeds and one more fails.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fuzz/fuzz_util.h"
#include "launcher/hostfile.h"

using namespace troupe::launcher;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts = absl::StrSplit(input, absl::MaxSplits('\0', 2));
  parts.resize(3);
  auto hosts = parse_hostfile(parts[0], "hostfile");
  if (!hosts.ok()) {
    FUZZ_CHECK(absl::StartsWith(hosts.status().message(), "hostfile"));
    return 0;
  }
  std::string printed;
  for (const HostEntry& h : *hosts) {
    FUZZ_CHECK(!h.host.empty() && h.slots >= 1);
    absl::StrAppend(&printed, h.host, " slots=", h.slots, "\n");
  }
  auto again = parse_hostfile(printed, "printed");
  FUZZ_CHECK(again.ok() && again->size() == hosts->size());
  for (std::size_t i = 0; i < hosts->size(); i++)
    FUZZ_CHECK((*again)[i].host == (*hosts)[i].host && (*again)[i].slots == (*hosts)[i].slots);
  auto slots = filter_slots(*hosts, parts[1], parts[2]);
  if (!slots.ok()) return 0;
  std::size_t total = 0, at = 0;
  for (const HostSlots& h : *slots) {
    while (at < hosts->size() && (*hosts)[at].host != h.host) at++;
    FUZZ_CHECK(at < hosts->size());  // in the file's order
    std::vector<bool> seen(static_cast<std::size_t>((*hosts)[at].slots));
    for (int slot : h.slots) {
      FUZZ_CHECK(slot >= 0 && slot < (*hosts)[at].slots);
      FUZZ_CHECK(!seen[static_cast<std::size_t>(slot)]);
      seen[static_cast<std::size_t>(slot)] = true;
    }
    total += h.slots.size();
  }
  if (total > (1u << 16)) return 0;  // placement is linear: keep the target fast
  FUZZ_CHECK(place_ranks(*slots, static_cast<int>(total)).ok());
  FUZZ_CHECK(!place_ranks(*slots, static_cast<int>(total) + 1).ok());
  return 0;
}
