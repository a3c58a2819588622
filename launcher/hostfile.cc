// Hostfiles, resource filters and rank placement; see launcher/hostfile.h.
#include "launcher/hostfile.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace troupe::launcher {
namespace {

absl::Status at(absl::string_view source, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", what));
}

// A positive count ("8", not "08x" or "-1").
bool parse_count(absl::string_view s, int* n) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  return absl::SimpleAtoi(s, n) && *n > 0;
}

}  // namespace

absl::StatusOr<std::vector<HostEntry>> parse_hostfile(absl::string_view text,
                                                      absl::string_view source) {
  std::vector<HostEntry> hosts;
  std::map<std::string, int> seen;  // host -> line
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    number++;
    if (auto hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.size() != 2 || !absl::StartsWith(words[1], "slots=")) {
      return at(source, number,
                absl::StrCat("'", line, "' is not a hostfile entry (HOST slots=N)"));
    }
    int slots = 0;
    const absl::string_view count = words[1].substr(6);
    if (!parse_count(count, &slots))
      return at(source, number, absl::StrCat("slots=", count, ": not a positive integer"));
    if (slots > kMaxSlotsPerHost) {
      return at(source, number,
                absl::StrCat("slots=", count, ": at most ", kMaxSlotsPerHost, " per host"));
    }
    const std::string host(words[0]);
    if (auto it = seen.find(host); it != seen.end()) {
      return at(source, number,
                absl::StrCat("host '", host, "' is listed again (first at line ", it->second, ")"));
    }
    seen[host] = number;
    hosts.push_back({host, slots, number});
  }
  if (hosts.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no hosts"));
  return hosts;
}

absl::StatusOr<std::vector<HostEntry>> read_hostfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the hostfile"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return parse_hostfile(ss.str(), path);
}

absl::StatusOr<std::vector<HostEntry>> hosts_from_list(absl::string_view list, int slots_per_host) {
  std::vector<HostEntry> hosts;
  int i = 0;
  for (absl::string_view h : absl::StrSplit(list, ',')) {
    i++;
    h = absl::StripAsciiWhitespace(h);
    if (h.empty())
      return absl::InvalidArgumentError(absl::StrCat("--hosts: entry ", i, " is empty"));
    for (const HostEntry& e : hosts)
      if (e.host == h)
        return absl::InvalidArgumentError(absl::StrCat("--hosts: '", h, "' is listed twice"));
    hosts.push_back({std::string(h), slots_per_host, i});
  }
  return hosts;
}

absl::StatusOr<std::vector<HostSlots>> filter_slots(const std::vector<HostEntry>& hosts,
                                                    absl::string_view include,
                                                    absl::string_view exclude) {
  if (!include.empty() && !exclude.empty())
    return absl::InvalidArgumentError("--include and --exclude are mutually exclusive");
  std::map<std::string, int> slots_of;
  for (const HostEntry& e : hosts) slots_of[e.host] = e.slots;
  const bool including = !include.empty();
  const absl::string_view spec = including ? include : exclude;
  const char* flag = including ? "--include" : "--exclude";
  // host -> chosen slots (include) or removed slots (exclude); -1: all.
  std::map<std::string, std::vector<int>> named;
  if (!spec.empty()) {
    for (absl::string_view node : absl::StrSplit(spec, '@')) {
      std::vector<absl::string_view> parts = absl::StrSplit(node, absl::MaxSplits(':', 1));
      const std::string host(parts[0]);
      if (slots_of.count(host) == 0)
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " ", spec, ": host '", host, "' is not in the hostfile"));
      auto& list = named[host];
      if (parts.size() == 1) {
        list.push_back(-1);
        continue;
      }
      for (absl::string_view s : absl::StrSplit(parts[1], ',')) {
        int slot = 0;
        if (!absl::SimpleAtoi(s, &slot) || slot < 0 || slot >= slots_of[host])
          return absl::InvalidArgumentError(absl::StrCat(flag, " ", spec, ": host '", host,
                                                         "' has no slot '", s, "' (it has ",
                                                         slots_of[host], ")"));
        list.push_back(slot);
      }
    }
  }
  std::vector<HostSlots> out;
  for (const HostEntry& e : hosts) {
    HostSlots h{e.host, {}};
    auto it = named.find(e.host);
    const std::vector<int> none;
    const std::vector<int>& list = it == named.end() ? none : it->second;
    const bool all = std::count(list.begin(), list.end(), -1) > 0;
    auto listed = [&](int s) { return std::count(list.begin(), list.end(), s) > 0; };
    if (spec.empty() || (including && all)) {
      for (int s = 0; s < e.slots; s++) h.slots.push_back(s);
    } else if (including) {  // the slots in the order given, each once (as DeepSpeed)
      for (int s : list)
        if (std::count(h.slots.begin(), h.slots.end(), s) == 0) h.slots.push_back(s);
    } else if (!all) {
      for (int s = 0; s < e.slots; s++)
        if (!listed(s)) h.slots.push_back(s);
    }
    if (!h.slots.empty()) out.push_back(std::move(h));
  }
  if (out.empty())
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", spec, " leaves no slot"));
  return out;
}

absl::StatusOr<std::vector<Placement>> place_ranks(const std::vector<HostSlots>& hosts, int world) {
  std::size_t total = 0;
  for (const HostSlots& h : hosts) total += h.slots.size();
  if (world < 1) return absl::InvalidArgumentError("a job needs at least one rank");
  if (total < static_cast<std::size_t>(world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the hosts have ", total, " slots for ", world, " ranks (tp x pp x dp)"));
  }
  std::vector<Placement> out;
  for (const HostSlots& h : hosts) {
    for (std::size_t i = 0; i < h.slots.size() && static_cast<int>(out.size()) < world; i++) {
      out.push_back({static_cast<int>(out.size()), h.host, static_cast<int>(i), h.slots[i]});
    }
  }
  return out;
}

}  // namespace troupe::launcher
