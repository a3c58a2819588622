// Writing a rank's trace file (actors/diagnostics/trace_file.h).
#include "actors/diagnostics/trace_file.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "model/atomic_file.h"

namespace troupe::actors {

namespace trace = comm::trace;

std::string trace_file_name(int rank) {
  char name[40];
  std::snprintf(name, sizeof(name), "rank-%05d.trace.jsonl", rank);
  return name;
}

std::string trace_event_json(const trace::Event& e, bool open) {
  std::string out = absl::StrCat("{\"k\":\"", trace::kind_name(e.kind), "\",\"b\":", e.begin_ns);
  if (open) {
    absl::StrAppend(&out, ",\"open\":true");
  } else {
    absl::StrAppend(&out, ",\"e\":", e.end_ns);
  }
  absl::StrAppend(&out, ",\"step\":", e.step);
  switch (e.kind) {
    case trace::Kind::kForward:
    case trace::Kind::kBackward:
    case trace::Kind::kWeight:
      absl::StrAppend(&out, ",\"mb\":", e.micro, ",\"chunk\":", e.chunk, ",\"vs\":", e.layer);
      if (e.eval) absl::StrAppend(&out, ",\"eval\":true");
      break;
    case trace::Kind::kSend:
    case trace::Kind::kRecv: {
      char tag[24];
      std::snprintf(tag, sizeof(tag), "0x%016" PRIx64, e.tag);
      absl::StrAppend(&out, ",\"peer\":", e.peer, ",\"msg\":\"", trace::message_name(e.tag),
                      "\",\"mb\":", e.micro, ",\"chunk\":", e.chunk, ",\"layer\":", e.layer,
                      ",\"bytes\":", e.bytes, ",\"tag\":\"", tag, "\"");
      if (e.seq >= 0) absl::StrAppend(&out, ",\"seq\":", e.seq);
      if (!open) absl::StrAppend(&out, ",\"status\":\"", e.failed ? "error" : "ok", "\"");
      break;
    }
    case trace::Kind::kCollective:
      absl::StrAppend(&out, ",\"group\":\"tp\",\"op\":\"", trace::what_name(e.what),
                      "\",\"bytes\":", e.bytes, ",\"seq\":", e.seq, ",\"mb\":", e.micro,
                      ",\"chunk\":", e.chunk);
      break;
    case trace::Kind::kPhase:
      absl::StrAppend(&out, ",\"name\":\"", trace::what_name(e.what), "\",\"seq\":", e.seq,
                      ",\"bytes\":", e.bytes);
      break;
    case trace::Kind::kOptimizer:
      absl::StrAppend(&out, ",\"op\":\"", trace::what_name(e.what), "\",\"chunk\":", e.chunk);
      if (e.micro >= 0) absl::StrAppend(&out, ",\"contribution\":", e.micro);
      break;
    case trace::Kind::kWait:
      absl::StrAppend(&out, ",\"actor\":\"",
                      e.actor == 0   ? "shard"
                      : e.actor == 1 ? "optimizer"
                                     : "stream",
                      "\",\"what\":\"", trace::what_name(e.what), "\",\"peer\":", e.peer,
                      ",\"mb\":", e.micro, ",\"chunk\":", e.chunk);
      break;
    case trace::Kind::kStep:
      absl::StrAppend(&out, ",\"pass\":\"", trace::what_name(e.what), "\"");
      if (e.micro > 0) absl::StrAppend(&out, ",\"m\":", e.micro);  // the step's micro-batches
      break;
  }
  out += '}';
  return out;
}

absl::Status write_trace_file(const std::string& dir, const TraceHeader& h,
                              const trace::Recorder& recorder) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  const trace::Recorder::Contents c = recorder.contents();
  nlohmann::json head = {
      {"format", "troupe-trace"},
      {"version", 1},
      {"rank", h.rank},
      {"d", h.coord.d},
      {"s", h.coord.s},
      {"t", h.coord.t},
      {"host", h.host},
      {"pid", h.pid},
      {"layout",
       {{"tp", h.layout.tp}, {"pp", h.layout.pp}, {"dp", h.layout.dp}, {"v", h.virtual_stages}}},
      {"schedule", schedule_name(h.schedule)},
      {"m", h.m},
      {"reason", h.reason},
      {"message", h.message},
      {"clock", {{"offset_ns", h.clock_offset_ns}, {"uncertainty_ns", h.clock_uncertainty_ns}}},
      {"capacity", c.capacity},
      {"recorded", c.recorded},
      {"dropped", c.dropped},
  };
  if (recorder.first_step() > 0 || recorder.last_step() < (1 << 30)) {
    head["trace_steps"] = {recorder.first_step(), recorder.last_step()};
  } else {
    head["trace_steps"] = nullptr;
  }
  std::string text = head.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  for (const trace::Event& e : c.events) {
    text += trace_event_json(e, false);
    text += '\n';
  }
  for (const trace::Event& e : c.open) {
    text += trace_event_json(e, true);
    text += '\n';
  }
  const std::string path = (std::filesystem::path(dir) / trace_file_name(h.rank)).string();
  absl::StatusOr<model::AtomicFile> f = model::AtomicFile::create(path);
  if (!f.ok()) return f.status();
  if (absl::Status st = f->write(text); !st.ok()) return st;
  return f->commit();
}

void remove_trace_files(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() == trace_file_name(0).size() && name.rfind("rank-", 0) == 0 &&
        name.find(".trace.jsonl") == name.size() - 12) {
      std::filesystem::remove(it->path(), ec);
    }
  }
}

std::string default_flight_dir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
    std::error_code ec;
    const char* parent = std::getenv("TROUPE_FLIGHT_DIR");
    const std::filesystem::path base = parent != nullptr && parent[0] != '\0'
                                           ? std::filesystem::absolute(parent, ec)
                                           : std::filesystem::current_path(ec);
    dir = (base / absl::StrCat("troupe-flight-", stamp, "-", getpid())).string();
  });
  return dir;
}

std::string flight_note(const std::string& dir, const absl::Status& written) {
  if (!written.ok()) return absl::StrCat("flight recorder: not written: ", written.message());
  return absl::StrCat("flight recorder: ", dir,
                      " (rank-*.trace.jsonl; read them with `troupe trace ", dir, "`)");
}

}  // namespace troupe::actors
