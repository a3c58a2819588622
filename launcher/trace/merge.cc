// The merged Chrome trace-event JSON (launcher/trace/merge.h).
#include "launcher/trace/merge.h"

#include <algorithm>
#include <map>
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

// chunks: model chunks per rank (the chunk is named only when there are several).
std::string slice_name(const Event& ev, int chunks) {
  std::string n;
  switch (ev.kind) {
    case Kind::kForward:
    case Kind::kBackward:
    case Kind::kWeight:
      n = absl::StrCat(ev.eval ? "eval " : "", kind_name(ev.kind), " mb ", ev.mb);
      if (chunks > 1) absl::StrAppend(&n, " chunk ", std::max(ev.chunk, 0));
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

// The trace's events, each dumped as it comes: a full ring per rank is
// millions of events, too many to hold as one JSON tree.
class EventList {
 public:
  void push_back(const json& e) {
    if (!text_.empty()) text_ += ",\n";
    text_ += e.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// Messages overlap (many are in flight at once), and the slices of one
// thread must nest, so each rank's sends and receives are spread over
// lanes: a lane takes an event only once its last one has ended. Lane 0 is
// the track's own thread; lane k > 0 is thread 1000 * track + k.
int lane_tid(Track track, int lane) {
  return lane == 0 ? static_cast<int>(track) : 1000 * static_cast<int>(track) + lane;
}

struct Lanes {
  std::vector<std::vector<int>> tid;        // [rank index][event index]
  std::vector<std::map<Track, int>> count;  // [rank index]: lanes of a track
};

Lanes assign_lanes(const Trace& t, std::int64_t end) {
  Lanes l;
  for (const RankTrace& r : t.ranks) {
    std::vector<int> tids(r.events.size());
    std::map<Track, int> count;
    std::vector<int> order(r.events.size());
    for (std::size_t i = 0; i < order.size(); i++) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&r](int a, int b) { return r.events[a].b < r.events[b].b; });
    std::map<Track, std::vector<std::int64_t>> free_at;  // per lane: when its last event ended
    for (int i : order) {
      const Event& ev = r.events[static_cast<std::size_t>(i)];
      const Track track = track_of(ev);
      count.emplace(track, 1);
      if (track != Track::kSends && track != Track::kReceives) {
        tids[static_cast<std::size_t>(i)] = static_cast<int>(track);
        continue;
      }
      std::vector<std::int64_t>& lanes = free_at[track];
      std::size_t k = 0;
      while (k < lanes.size() && lanes[k] > ev.b) k++;
      if (k == lanes.size()) lanes.push_back(0);
      lanes[k] = ev.open ? end : ev.e;
      count[track] = std::max(count[track], static_cast<int>(k) + 1);
      tids[static_cast<std::size_t>(i)] = lane_tid(track, static_cast<int>(k));
    }
    l.tid.push_back(std::move(tids));
    l.count.push_back(std::move(count));
  }
  return l;
}

void add_metadata(const Trace& t, const Lanes& lanes, EventList* events) {
  for (std::size_t ri = 0; ri < t.ranks.size(); ri++) {
    const RankTrace& r = t.ranks[ri];
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
      const Track track = static_cast<Track>(k);
      auto n = lanes.count[ri].find(track);
      const int count = n == lanes.count[ri].end() ? 1 : n->second;
      for (int lane = 0; lane < count; lane++) {
        const std::string name =
            lane == 0 ? track_name(track) : absl::StrCat(track_name(track), " (", lane + 1, ")");
        events->push_back({{"ph", "M"},
                           {"name", "thread_name"},
                           {"pid", pid},
                           {"tid", lane_tid(track, lane)},
                           {"args", {{"name", name}}}});
        events->push_back({{"ph", "M"},
                           {"name", "thread_sort_index"},
                           {"pid", pid},
                           {"tid", lane_tid(track, lane)},
                           {"args", {{"sort_index", 1000 * k + lane}}}});
      }
    }
  }
}

// A flow per matched message, bound to its send's and its receive's
// slices; returns how many.
int add_flows(const Trace& t, const std::vector<Message>& messages, const Lanes& lanes,
              std::int64_t origin, std::int64_t end, EventList* events) {
  auto tid = [&lanes](EventRef r) {
    return lanes.tid[static_cast<std::size_t>(r.rank)][static_cast<std::size_t>(r.index)];
  };
  int id = 0;
  for (const Message& m : messages) {
    if (!m.matched()) continue;
    const Event& s = event_of(t, *m.send);
    const Event& rv = event_of(t, *m.recv);
    const std::int64_t rv_end = rv.open ? end : rv.e;
    // "s" binds to the slice enclosing its ts (the send, at its post); "f"
    // with "bp":"e" to the slice enclosing its ts: the receive, just before
    // its completion (its last nanosecond), so the arrow ends where the
    // bytes arrived.
    const std::int64_t f_ts = std::max(rv.b, rv_end - 1);
    ++id;
    events->push_back({{"ph", "s"},
                       {"id", id},
                       {"name", s.msg},
                       {"cat", "message"},
                       {"pid", m.from},
                       {"tid", tid(*m.send)},
                       {"ts", us(s.b - origin)}});
    events->push_back({{"ph", "f"},
                       {"bp", "e"},
                       {"id", id},
                       {"name", s.msg},
                       {"cat", "message"},
                       {"pid", m.to},
                       {"tid", tid(*m.recv)},
                       {"ts", us(f_ts - origin)}});
  }
  return id;
}

}  // namespace

Track track_of(const Event& ev) {
  switch (ev.kind) {
    case Kind::kForward:
    case Kind::kBackward:
    case Kind::kWeight:
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
      // (The compute stream's waits at a gate, for an op's input, are on
      // its own track, between its ops.)
      return ev.actor == "optimizer" ? Track::kOptimizerActor
             : ev.actor == "stream"  ? Track::kCompute
                                     : Track::kShard;
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
  EventList events;
  const Lanes lanes = assign_lanes(t, end);
  add_metadata(t, lanes, &events);
  for (std::size_t ri = 0; ri < t.ranks.size(); ri++) {
    const RankTrace& r = t.ranks[ri];
    for (std::size_t i = 0; i < r.events.size(); i++) {
      const Event& ev = r.events[i];
      const std::int64_t e = ev.open ? end : ev.e;
      events.push_back({{"ph", "X"},
                        {"name", slice_name(ev, r.header.v)},
                        {"cat", kind_name(ev.kind)},
                        {"pid", r.header.rank},
                        {"tid", lanes.tid[ri][i]},
                        {"ts", us(ev.b - origin)},
                        {"dur", us(e - ev.b)},
                        {"args", slice_args(ev)}});
    }
  }
  int unmatched = 0;
  for (const Message& m : messages) unmatched += !m.matched();
  const int flows = add_flows(t, messages, lanes, origin, end, &events);
  const json other = {{"generator", "troupe trace"},
                      {"dir", t.dir},
                      {"ranks", t.ranks.size()},
                      {"clock_uncertainty_ns", t.uncertainty_ns()},
                      {"flows", flows},
                      {"unmatched_messages", unmatched}};
  return absl::StrCat("{\"traceEvents\":[\n", events.text(),
                      "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":",
                      other.dump(-1, ' ', false, json::error_handler_t::replace), "}\n");
}

}  // namespace troupe::launcher::trace
