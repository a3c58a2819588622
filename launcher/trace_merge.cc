// The merged Chrome trace-event JSON (trace_merge.h).
#include "launcher/trace_merge.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace troupe::launcher::trace {
namespace {
using json = nlohmann::json;

// The end of the trace: where open events are drawn to.
std::int64_t trace_end(const Trace& t) {
  std::int64_t end = t.origin();
  for (const RankTrace& r : t.ranks) {
    for (const Event& e : r.events) end = std::max(end, e.e);
  }
  return end;
}

std::string slice_name(const Event& ev) {
  std::string n;
  switch (ev.kind) {
    case Kind::kForward:
    case Kind::kBackward:
      n = absl::StrCat(ev.eval ? "eval " : "", kind_name(ev.kind), " mb ", ev.mb);
      if (ev.chunk > 0 || ev.vs >= 0) absl::StrAppend(&n, " chunk ", std::max(ev.chunk, 0));
      break;
    case Kind::kSend:
    case Kind::kRecv:
      n = absl::StrCat(kind_name(ev.kind), " ", ev.msg,
                       ev.mb >= 0 ? absl::StrCat(" mb ", ev.mb) : "",
                       ev.kind == Kind::kSend ? " to " : " from ", ev.peer);
      break;
    case Kind::kCollective:
      n = absl::StrCat(ev.group, " ", ev.op, " #", ev.seq);
      break;
    case Kind::kPhase:
      n = absl::StrCat(ev.name, " #", ev.seq);
      break;
    case Kind::kOptimizer:
      n = absl::StrCat("optimizer ", ev.op);
      break;
    case Kind::kWait:
      n = absl::StrCat("wait ", ev.what);
      break;
    case Kind::kStep:
      n = absl::StrCat("step ", ev.step, ev.pass.empty() ? "" : " " + ev.pass);
      break;
  }
  if (ev.open) absl::StrAppend(&n, " (open)");
  return n;
}

json slice_args(const Event& ev) {
  json a = {{"step", ev.step}};
  if (ev.mb >= 0) a["mb"] = ev.mb;
  if (ev.chunk >= 0) a["chunk"] = ev.chunk;
  if (ev.vs >= 0) a["vs"] = ev.vs;
  if (ev.peer >= 0) a["peer"] = ev.peer;
  if (!ev.msg.empty()) a["msg"] = ev.msg;
  if (ev.bytes > 0) a["bytes"] = ev.bytes;
  if (!ev.tag.empty()) a["tag"] = ev.tag;
  if (!ev.status.empty()) a["status"] = ev.status;
  if (ev.layer >= 0) a["layer"] = ev.layer;
  if (!ev.actor.empty()) a["actor"] = ev.actor;
  if (ev.open) a["open"] = true;
  return a;
}

double us(std::int64_t ns) { return static_cast<double>(ns) / 1e3; }

void add_metadata(const Trace& t, json* events) {
  for (const RankTrace& r : t.ranks) {
    const int pid = r.header.rank;
    events->push_back({{"ph", "M"},
                       {"name", "process_name"},
                       {"pid", pid},
                       {"args", {{"name", r.header.describe()}}}});
    events->push_back({{"ph", "M"},
                       {"name", "process_sort_index"},
                       {"pid", pid},
                       {"args", {{"sort_index", pid}}}});
    for (int k = 1; k <= static_cast<int>(Track::kReceives); k++) {
      events->push_back({{"ph", "M"},
                         {"name", "thread_name"},
                         {"pid", pid},
                         {"tid", k},
                         {"args", {{"name", track_name(static_cast<Track>(k))}}}});
      events->push_back({{"ph", "M"},
                         {"name", "thread_sort_index"},
                         {"pid", pid},
                         {"tid", k},
                         {"args", {{"sort_index", k}}}});
    }
  }
}

}  // namespace

Track track_of(const Event& ev) {
  switch (ev.kind) {
    case Kind::kForward:
    case Kind::kBackward:
    case Kind::kCollective:
    case Kind::kPhase:
      return Track::kCompute;
    case Kind::kSend:
      return Track::kSends;
    case Kind::kRecv:
      return Track::kReceives;
    case Kind::kOptimizer:
      return Track::kOptimizerStream;
    case Kind::kWait:
      return ev.actor == "optimizer" ? Track::kOptimizerActor : Track::kShard;
    case Kind::kStep:
      return Track::kShard;
  }
  return Track::kShard;
}

const char* track_name(Track t) {
  switch (t) {
    case Track::kCompute:
      return "compute stream";
    case Track::kShard:
      return "shard actor";
    case Track::kOptimizerStream:
      return "optimizer stream";
    case Track::kOptimizerActor:
      return "optimizer actor";
    case Track::kSends:
      return "sends";
    case Track::kReceives:
      return "receives";
  }
  return "?";
}

std::string chrome_json(const Trace& t, const std::vector<Message>& messages) {
  const std::int64_t origin = t.origin(), end = trace_end(t);
  json events = json::array();
  add_metadata(t, &events);
  for (const RankTrace& r : t.ranks) {
    for (const Event& ev : r.events) {
      const std::int64_t e = ev.open ? end : ev.e;
      events.push_back({{"ph", "X"},
                        {"name", slice_name(ev)},
                        {"cat", kind_name(ev.kind)},
                        {"pid", r.header.rank},
                        {"tid", static_cast<int>(track_of(ev))},
                        {"ts", us(ev.b - origin)},
                        {"dur", us(e - ev.b)},
                        {"args", slice_args(ev)}});
    }
  }
  int id = 0, unmatched = 0;
  for (const Message& m : messages) {
    if (!m.matched()) {
      unmatched++;
      continue;
    }
    const Event& s = event_of(t, *m.send);
    const Event& rv = event_of(t, *m.recv);
    const std::int64_t rv_end = rv.open ? end : rv.e;
    // "s" binds to the slice enclosing its ts (the send, at its post); "f"
    // with "bp":"e" to the slice enclosing its ts: the receive, just before
    // its completion (its last nanosecond), so the arrow ends where the
    // bytes arrived.
    const std::int64_t f_ts = std::max(rv.b, rv_end - 1);
    ++id;
    events.push_back({{"ph", "s"},
                      {"id", id},
                      {"name", s.msg},
                      {"cat", "message"},
                      {"pid", m.from},
                      {"tid", static_cast<int>(Track::kSends)},
                      {"ts", us(s.b - origin)}});
    events.push_back({{"ph", "f"},
                      {"bp", "e"},
                      {"id", id},
                      {"name", s.msg},
                      {"cat", "message"},
                      {"pid", m.to},
                      {"tid", static_cast<int>(Track::kReceives)},
                      {"ts", us(f_ts - origin)}});
  }
  json out = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"generator", "troupe trace"},
                {"dir", t.dir},
                {"ranks", t.ranks.size()},
                {"clock_uncertainty_ns", t.uncertainty_ns()},
                {"flows", id},
                {"unmatched_messages", unmatched}}}};
  return out.dump(1);
}

}  // namespace troupe::launcher::trace
