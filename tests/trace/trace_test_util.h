// Hand-written rank trace files for the tests of launcher/trace/.
//
//   RankFile f = rank_file({.rank = 1, .s = 1, .pp = 2, .m = 2});
//   f.add(op("forward", 10, 20, /*step=*/1, /*mb=*/0));
//   trace::Trace t = assemble({f0, f1});
//
// Times are written in ms and stored as ns; a file's offset_ns is
// subtracted from every time it writes, as a rank whose steady clock is
// behind the coordinator's by that much would record them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/trace/files.h"

namespace troupe::launcher::trace::testing {

using json = nlohmann::json;

inline std::int64_t ns(double ms) { return static_cast<std::int64_t>(ms * 1e6 + 0.5); }

struct HeaderSpec {
  int rank = 0, d = 0, s = 0, t = 0;
  int tp = 1, pp = 1, dp = 1, v = 1;
  std::string schedule = "1f1b";
  int m = 1;
  std::string reason = "end", message = "";
  std::int64_t offset_ns = 0, uncertainty_ns = 0, dropped = 0;
  std::string host = "h0";
};

struct RankFile {
  HeaderSpec h;
  std::vector<json> events;

  void add(json e) {
    for (const char* k : {"b", "e"}) {
      if (e.contains(k)) e[k] = ns(e[k].get<double>()) - h.offset_ns;
    }
    events.push_back(std::move(e));
  }
  std::string text() const {
    json head = {{"format", "troupe-trace"},
                 {"version", 1},
                 {"rank", h.rank},
                 {"d", h.d},
                 {"s", h.s},
                 {"t", h.t},
                 {"host", h.host},
                 {"pid", 100 + h.rank},
                 {"layout", {{"tp", h.tp}, {"pp", h.pp}, {"dp", h.dp}, {"v", h.v}}},
                 {"schedule", h.schedule},
                 {"m", h.m},
                 {"reason", h.reason},
                 {"message", h.message},
                 {"clock", {{"offset_ns", h.offset_ns}, {"uncertainty_ns", h.uncertainty_ns}}},
                 {"capacity", 1000},
                 {"recorded", events.size()},
                 {"dropped", h.dropped},
                 {"trace_steps", nullptr}};
    std::string out = head.dump() + "\n";
    for (const json& e : events) out += e.dump() + "\n";
    return out;
  }
};

inline json op(const char* kind, double b, double e, int step, int mb, int chunk = 0) {
  return {{"k", kind}, {"b", b}, {"e", e}, {"step", step}, {"mb", mb}, {"chunk", chunk}};
}
inline json step_event(double b, double e, int step) {
  return {{"k", "step"}, {"b", b}, {"e", e}, {"step", step}, {"pass", "train"}};
}
inline json message(const char* kind, double b, double e, int step, int peer, const char* msg,
                    int mb, const std::string& tag, std::int64_t bytes = 4096) {
  return {{"k", kind},      {"b", b},     {"e", e},        {"step", step},
          {"peer", peer},   {"msg", msg}, {"mb", mb},      {"chunk", 0},
          {"bytes", bytes}, {"tag", tag}, {"status", "ok"}};
}
inline json open_event(json e) {
  e.erase("e");
  e["open"] = true;
  return e;
}

inline Trace assemble(const std::vector<RankFile>& files) {
  std::vector<RankTrace> ranks;
  for (const RankFile& f : files) {
    absl::StatusOr<RankTrace> r =
        parse_rank_file("rank-" + std::to_string(f.h.rank) + ".trace.jsonl", f.text());
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) ranks.push_back(std::move(*r));
  }
  absl::StatusOr<Trace> t = assemble_trace("DIR", std::move(ranks));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : Trace{};
}

}  // namespace troupe::launcher::trace::testing
