// UcxTransport::describe_lanes: which UCX transports reach each peer.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/ucx_transport.h"

namespace troupe::comm {
namespace {

// UCX's own text for one endpoint (ucp_ep_print_info writes to a FILE*).
std::string ep_info(ucp_ep_h ep) {
  char* buf = nullptr;
  std::size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (f == nullptr) return {};
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

// The "transport/device" of each lane, in lane order, without repeats. UCX
// 1.13 prints a lane as
//   "#                 lane[1]:  8:tcp/eth0.0 md[4]  -> md[4]/tcp/sysdev[255] am ..."
// (resource index, then transport/device, a ".N" path index on the device).
std::vector<std::string> lane_transports(const std::string& info) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    const std::size_t lane = line.find("lane[");
    if (lane == absl::string_view::npos) continue;
    const std::size_t colon = line.find(':', lane);
    if (colon == absl::string_view::npos) continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    absl::string_view tl = words[0];  // "8:tcp/eth0.0"
    if (const std::size_t c = tl.find(':'); c != absl::string_view::npos) tl.remove_prefix(c + 1);
    if (const std::size_t dot = tl.rfind('.');
        dot != absl::string_view::npos && dot > tl.find('/')) {
      tl = tl.substr(0, dot);
    }
    const std::string name(tl);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

}  // namespace

std::string UcxTransport::describe_lanes() {
  std::lock_guard<std::mutex> lock(worker_mu_);  // the endpoints belong to the worker
  std::vector<std::string> peers;
  for (std::size_t r = 0; r < eps_.size(); r++) {
    if (eps_[r] == nullptr) continue;
    std::vector<std::string> lanes = lane_transports(ep_info(static_cast<ucp_ep_h>(eps_[r])));
    std::string entry =
        absl::StrCat("rank ", r, ": ", lanes.empty() ? "?" : absl::StrJoin(lanes, " "));
    if (static_cast<int>(r) != rank_) {
      absl::StrAppend(&entry, " (single copy ", same_host_[r] ? "on" : "off", ", ",
                      single_copy_bytes_from(static_cast<int>(r)), " bytes)");
    }
    peers.push_back(std::move(entry));
  }
  return absl::StrJoin(peers, "; ");
}

}  // namespace troupe::comm
