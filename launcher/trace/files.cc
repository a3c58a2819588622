// Reading and checking rank trace files (launcher/trace/files.h).
#include "launcher/trace/files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace troupe::launcher::trace {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

// Errors of one line: "path:line: what".
struct Where {
  const std::string& path;
  int line;
  absl::Status error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
  }
};

// A required field of type T, or an error naming it.
template <typename T>
absl::Status need(const json& o, const char* key, T* out, const Where& w) {
  auto it = o.find(key);
  if (it == o.end()) return w.error(absl::StrCat("missing \"", key, "\""));
  bool ok = false;
  if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
  } else if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else {
    ok = it->is_number_integer();
  }
  if (!ok) return w.error(absl::StrCat("\"", key, "\" has the wrong type: ", it->dump()));
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const std::int64_t v = it->get<std::int64_t>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      return w.error(absl::StrCat("\"", key, "\" out of range: ", v));
    }
    *out = static_cast<T>(v);
  } else {
    *out = it->get<T>();
  }
  return absl::OkStatus();
}

// An optional field: absent leaves *out as it is; present must have type T.
template <typename T>
absl::Status maybe(const json& o, const char* key, T* out, const Where& w) {
  if (!o.contains(key)) return absl::OkStatus();
  return need(o, key, out, w);
}

#define TRY(expr)                                         \
  do {                                                    \
    if (absl::Status _st = (expr); !_st.ok()) return _st; \
  } while (0)

absl::StatusOr<Header> parse_header(const json& o, const Where& w) {
  Header h;
  std::string format;
  int version = 0;
  if (!o.is_object()) return w.error("not a troupe trace: the header is not a JSON object");
  TRY(need(o, "format", &format, w));
  if (format != "troupe-trace") {
    return w.error(absl::StrCat("not a troupe trace: format \"", format, "\""));
  }
  TRY(need(o, "version", &version, w));
  if (version != 1)
    return w.error(absl::StrCat("trace version ", version, ": this reader knows 1"));
  TRY(need(o, "rank", &h.rank, w));
  TRY(need(o, "d", &h.d, w));
  TRY(need(o, "s", &h.s, w));
  TRY(need(o, "t", &h.t, w));
  TRY(need(o, "host", &h.host, w));
  TRY(need(o, "pid", &h.pid, w));
  if (!o.contains("layout") || !o["layout"].is_object())
    return w.error("missing \"layout\" object");
  const json& l = o["layout"];
  TRY(need(l, "tp", &h.tp, w));
  TRY(need(l, "pp", &h.pp, w));
  TRY(need(l, "dp", &h.dp, w));
  TRY(maybe(l, "v", &h.v, w));
  if (h.tp < 1 || h.pp < 1 || h.dp < 1 || h.v < 1) return w.error("layout sizes must be >= 1");
  TRY(need(o, "schedule", &h.schedule, w));
  TRY(need(o, "m", &h.m, w));
  // (Bounds, so that no reader loop or product of them runs away.)
  constexpr int kMax = 1 << 16;
  constexpr int kMaxM = 1 << 20;  // a tag's micro-batches (comm::kMaxMicroBatches)
  if (h.tp > kMax || h.pp > kMax || h.dp > kMax || h.v > kMax || h.m < 1 || h.m > kMaxM ||
      static_cast<std::int64_t>(h.tp) * h.pp * h.dp > (std::int64_t{1} << 24)) {
    return w.error(
        absl::StrFormat("layout tp=%d pp=%d dp=%d v=%d m=%d is out of range (each at "
                        "most %d, m at least 1, at most 2^24 ranks)",
                        h.tp, h.pp, h.dp, h.v, h.m, kMax));
  }
  TRY(need(o, "reason", &h.reason, w));
  TRY(maybe(o, "message", &h.message, w));
  if (!o.contains("clock") || !o["clock"].is_object()) return w.error("missing \"clock\" object");
  TRY(need(o["clock"], "offset_ns", &h.offset_ns, w));
  TRY(need(o["clock"], "uncertainty_ns", &h.uncertainty_ns, w));
  TRY(maybe(o, "capacity", &h.capacity, w));
  TRY(maybe(o, "recorded", &h.recorded, w));
  TRY(maybe(o, "dropped", &h.dropped, w));
  if (auto it = o.find("trace_steps"); it != o.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
        !(*it)[1].is_number_integer()) {
      return w.error(absl::StrCat("\"trace_steps\" must be [A,B] or null: ", it->dump()));
    }
    h.trace_steps = std::make_pair((*it)[0].get<int>(), (*it)[1].get<int>());
  }
  if (h.d < 0 || h.d >= h.dp || h.s < 0 || h.s >= h.pp || h.t < 0 || h.t >= h.tp) {
    return w.error(absl::StrFormat("(d,s,t) = (%d,%d,%d) is outside the layout tp=%d pp=%d dp=%d",
                                   h.d, h.s, h.t, h.tp, h.pp, h.dp));
  }
  const int want = h.s * (h.dp * h.tp) + h.d * h.tp + h.t;  // Megatron's order (comm/groups.h)
  if (h.rank != want) {
    return w.error(absl::StrFormat("rank %d but (d,s,t) = (%d,%d,%d) is rank %d", h.rank, h.d, h.s,
                                   h.t, want));
  }
  return h;
}

// Each kind by the name the runtime writes for it (comm::trace::kind_name).
const std::map<std::string, Kind>& kinds() {
  static const auto* m = [] {
    auto* out = new std::map<std::string, Kind>;
    for (Kind k : {Kind::kForward, Kind::kBackward, Kind::kSend, Kind::kRecv, Kind::kCollective,
                   Kind::kPhase, Kind::kOptimizer, Kind::kWait, Kind::kStep, Kind::kWeight}) {
      (*out)[kind_name(k)] = k;
    }
    return out;
  }();
  return *m;
}

absl::Status parse_fields(const json& o, Event* ev, const Where& w) {
  TRY(maybe(o, "mb", &ev->mb, w));
  TRY(maybe(o, "m", &ev->m, w));
  TRY(maybe(o, "chunk", &ev->chunk, w));
  TRY(maybe(o, "vs", &ev->vs, w));
  TRY(maybe(o, "eval", &ev->eval, w));
  TRY(maybe(o, "peer", &ev->peer, w));
  TRY(maybe(o, "msg", &ev->msg, w));
  TRY(maybe(o, "layer", &ev->layer, w));
  TRY(maybe(o, "bytes", &ev->bytes, w));
  TRY(maybe(o, "tag", &ev->tag, w));
  TRY(maybe(o, "status", &ev->status, w));
  TRY(maybe(o, "group", &ev->group, w));
  TRY(maybe(o, "op", &ev->op, w));
  TRY(maybe(o, "name", &ev->name, w));
  TRY(maybe(o, "actor", &ev->actor, w));
  TRY(maybe(o, "what", &ev->what, w));
  TRY(maybe(o, "pass", &ev->pass, w));
  TRY(maybe(o, "seq", &ev->seq, w));
  if (ev->kind == Kind::kSend || ev->kind == Kind::kRecv) {
    // What matching needs (launcher/trace/messages.h): without them a message
    // cannot be paired, so the file is not one the runtime wrote.
    TRY(need(o, "peer", &ev->peer, w));
    TRY(need(o, "tag", &ev->tag, w));
    TRY(need(o, "msg", &ev->msg, w));
  }
  return absl::OkStatus();
}

// One event line; nullopt for a kind this reader does not know.
absl::StatusOr<std::optional<Event>> parse_event(const json& o, std::int64_t offset,
                                                 const Where& w) {
  if (!o.is_object()) return w.error("an event must be a JSON object");
  std::string k;
  TRY(need(o, "k", &k, w));
  auto kind = kinds().find(k);
  if (kind == kinds().end()) return std::optional<Event>();
  Event ev;
  ev.kind = kind->second;
  ev.line = w.line;
  TRY(need(o, "b", &ev.b, w));
  TRY(need(o, "step", &ev.step, w));
  TRY(maybe(o, "open", &ev.open, w));
  if (ev.open) {
    ev.e = ev.b;
  } else {
    TRY(need(o, "e", &ev.e, w));
    if (ev.e < ev.b) return w.error(absl::StrFormat("ends (%d) before it begins (%d)", ev.e, ev.b));
  }
  TRY(parse_fields(o, &ev, w));
  ev.b += offset;
  ev.e += offset;
  return std::optional<Event>(std::move(ev));
}

absl::StatusOr<json> parse_json(absl::string_view line, const Where& w) {
  json o = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (o.is_discarded()) {
    std::string head(line.substr(0, 60));
    return w.error(absl::StrCat("not JSON: '", head, line.size() > 60 ? "...'" : "'"));
  }
  return o;
}

}  // namespace

std::string Header::coord() const { return absl::StrFormat("(%d,%d,%d)", d, s, t); }
std::string Header::describe() const {
  return absl::StrCat("rank ", rank, " ", coord(), " ", host);
}

const RankTrace* Trace::find(int rank) const {
  for (const RankTrace& r : ranks) {
    if (r.header.rank == rank) return &r;
  }
  return nullptr;
}

std::int64_t Trace::origin() const {
  std::int64_t o = std::numeric_limits<std::int64_t>::max();
  for (const RankTrace& r : ranks) {
    for (const Event& e : r.events) o = std::min(o, e.b);
  }
  return o == std::numeric_limits<std::int64_t>::max() ? 0 : o;
}

std::int64_t Trace::uncertainty_ns() const {
  std::int64_t u = 0;
  for (const RankTrace& r : ranks) u = std::max(u, r.header.uncertainty_ns);
  return u;
}

absl::StatusOr<RankTrace> parse_rank_file(const std::string& path, absl::string_view text) {
  RankTrace out;
  out.path = path;
  int line_no = 0;
  bool have_header = false;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    // A last line without its newline: the writer was cut off (the runtime
    // writes atomically, so this is damage, and an error).
    const bool cut = end == absl::string_view::npos;
    absl::string_view line = text.substr(pos, cut ? absl::string_view::npos : end - pos);
    pos = cut ? text.size() : end + 1;
    line_no++;
    const Where w{path, line_no};
    if (cut) return w.error("the last line has no newline: the file was cut off (truncated)");
    if (line.empty()) continue;
    absl::StatusOr<json> o = parse_json(line, w);
    if (!o.ok()) return o.status();
    if (!have_header) {
      absl::StatusOr<Header> h = parse_header(*o, w);
      if (!h.ok()) return h.status();
      out.header = *h;
      have_header = true;
      continue;
    }
    absl::StatusOr<std::optional<Event>> ev = parse_event(*o, out.header.offset_ns, w);
    if (!ev.ok()) return ev.status();
    if (ev->has_value()) {
      out.events.push_back(std::move(**ev));
    } else {
      out.skipped_unknown++;
    }
  }
  if (!have_header) return absl::InvalidArgumentError(absl::StrCat(path, ": empty: not a trace"));
  return out;
}

absl::StatusOr<Trace> assemble_trace(std::string dir, std::vector<RankTrace> ranks) {
  Trace t;
  t.dir = std::move(dir);
  if (ranks.empty()) {
    return absl::NotFoundError(absl::StrCat(t.dir, ": no rank-NNNNN.trace.jsonl files"));
  }
  std::sort(ranks.begin(), ranks.end(),
            [](const RankTrace& a, const RankTrace& b) { return a.header.rank < b.header.rank; });
  const Header& h0 = ranks.front().header;
  for (std::size_t i = 0; i < ranks.size(); i++) {
    const Header& h = ranks[i].header;
    if (i > 0 && h.rank == ranks[i - 1].header.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(ranks[i].path, ": rank ", h.rank, " also in ", ranks[i - 1].path));
    }
    if (h.tp != h0.tp || h.pp != h0.pp || h.dp != h0.dp || h.v != h0.v ||
        h.schedule != h0.schedule || h.m != h0.m) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: layout tp=%d pp=%d dp=%d v=%d, schedule %s, m=%d differs from %s's", ranks[i].path,
          h.tp, h.pp, h.dp, h.v, h.schedule, h.m, ranks.front().path));
    }
    if (h.dropped > 0) {
      t.warnings.push_back(absl::StrFormat(
          "%s: %d oldest events were overwritten (ring of %d): its trace starts mid-run",
          h.describe(), h.dropped, h.capacity));
    }
    if (ranks[i].skipped_unknown > 0) {
      t.warnings.push_back(absl::StrFormat("%s: %d events of unknown kinds skipped", ranks[i].path,
                                           ranks[i].skipped_unknown));
    }
  }
  const int world = h0.tp * h0.pp * h0.dp;
  std::vector<int> missing;
  for (int r = 0, i = 0; r < world; r++) {
    if (i < static_cast<int>(ranks.size()) && ranks[i].header.rank == r) {
      i++;
    } else {
      missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (int r : missing) absl::StrAppend(&list, list.empty() ? "" : ", ", r);
    t.warnings.push_back(
        absl::StrFormat("%d of %d ranks wrote no file: %s", missing.size(), world, list));
  }
  t.ranks = std::move(ranks);
  return t;
}

absl::StatusOr<Trace> read_trace(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  static const std::regex name(R"(rank-(\d{5})\.trace\.jsonl)");
  std::vector<RankTrace> ranks;
  for (const fs::directory_entry& f : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string base = f.path().filename().string();
    if (!std::regex_match(base, m, name)) continue;
    std::ifstream in(f.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return absl::NotFoundError(absl::StrCat(f.path().string(), ": cannot read"));
    absl::StatusOr<RankTrace> r = parse_rank_file(f.path().string(), text.str());
    if (!r.ok()) return r.status();
    if (r->header.rank != std::stoi(m[1].str())) {
      return absl::InvalidArgumentError(absl::StrCat(f.path().string(), ":1: the header says rank ",
                                                     r->header.rank, ", the name another"));
    }
    ranks.push_back(std::move(*r));
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  return assemble_trace(dir, std::move(ranks));
}

}  // namespace troupe::launcher::trace
