// Checkpoints: rank files, the manifest, the commit.
#include "model/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/atomic_file.h"
#include "model/checkpoint_json.h"

namespace troupe::model::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kParam:
      return "param";
    case Kind::kMaster:
      return "master";
    case Kind::kAdamM:
      return "adam_m";
    case Kind::kAdamV:
      return "adam_v";
  }
  return "?";
}

std::string Meta::describe_layout() const {
  return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp, " ", schedule,
                      virtual_stages > 1 ? absl::StrCat(" v=", virtual_stages) : "");
}

std::uint32_t crc_of(const void* data, std::size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const Bytef* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // crc32 takes a uInt length
    const uInt chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

std::string writer_name() { return absl::StrCat("troupe ", TROUPE_VERSION); }

std::string iter_name(int step) { return absl::StrFormat("iter_%07d", step); }
std::string rank_file_name(int rank) { return absl::StrFormat("rank_%05d.safetensors", rank); }

namespace {

std::string reason() { return std::strerror(errno); }

absl::Status fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat(path, ": cannot open to sync: ", reason()));
  const int rc = ::fsync(fd);
  const std::string why = reason();
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat(path, ": fsync failed: ", why));
  return absl::OkStatus();
}

// TROUPE_DEBUG_SAVE_DELAY=SECONDS, for tests only (tests/ckpt/ckpt_test.py
// kills a run inside a save): at each point of a save -- its temporary made,
// a rank's file written, the manifest written, the directory renamed (the
// tracker not yet), the tracker written -- say so on stderr and sleep that long, so that a kill
// lands between any two of them.
void debug_save_point(const char* point, const std::string& path) {
  const char* env = std::getenv("TROUPE_DEBUG_SAVE_DELAY");  // (read each time: cheap)
  double seconds = 0;
  if (env == nullptr || !absl::SimpleAtod(env, &seconds) || !(seconds > 0)) return;
  std::fprintf(stderr, "debug: save point: %s %s\n", point, path.c_str());
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

bool is_temp_name(const std::string& name) {
  return absl::StartsWith(name, "iter_") && absl::StrContains(name, ".tmp-");
}

// The steps of DIR's complete checkpoints (those with a manifest), newest last.
std::vector<int> complete_steps(const std::string& dir) {
  std::vector<int> steps;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int step = 0;
    if (!absl::StartsWith(name, "iter_") || is_temp_name(name)) continue;
    if (!absl::SimpleAtoi(name.substr(5), &step)) continue;
    if (fs::exists(e.path() / "manifest.json", ec)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Renames the complete `tmp_dir` to `final_dir`. A checkpoint of that step
// already there (an earlier run's, which the tracker may name) is swapped
// with the new one in one rename (RENAME_EXCHANGE), so that final_dir is a
// complete checkpoint at every moment; the old one, now under the
// temporary's name, is removed (or by the next begin_save after a crash).
// Where the filesystem cannot exchange (EINVAL: NFS, some FUSE), the old
// one is moved aside first; if the tracker names it, the tracker is first
// pointed at the newest other complete checkpoint, so that it names a
// complete one throughout (with no other, it is removed for that moment).
absl::Status move_into_place(const std::string& dir, const std::string& tmp_dir,
                             const std::string& final_dir, int step) {
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    const bool exchange = std::getenv("TROUPE_DEBUG_NO_RENAME_EXCHANGE") == nullptr;
    if (exchange &&
        ::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      debug_save_point("replacing", final_dir);
      if (absl::Status st = fsync_path(dir); !st.ok()) return st;
      fs::remove_all(tmp_dir, ec);
      return absl::OkStatus();
    }
    if (exchange && errno != EINVAL && errno != ENOSYS) {
      return absl::InternalError(
          absl::StrCat(final_dir, ": cannot replace it with ", tmp_dir, ": ", reason()));
    }
    const std::string tracker = absl::StrCat(dir, "/", kTracker);
    int named = -1;
    {
      std::ifstream in(tracker);
      if (!(in >> named)) named = -1;
    }
    if (named == step) {
      std::vector<int> others = complete_steps(dir);
      others.erase(std::remove(others.begin(), others.end(), step), others.end());
      absl::Status st = others.empty()
                            ? (fs::remove(tracker, ec), fsync_path(dir))
                            : write_file_atomically(tracker, absl::StrCat(others.back(), "\n"));
      if (!st.ok()) return st;
    }
    const std::string old = absl::StrCat(final_dir, ".tmp-replaced-", ::getpid());
    fs::rename(final_dir, old, ec);
    if (ec) return absl::InternalError(absl::StrCat(final_dir, ": cannot replace: ", ec.message()));
    debug_save_point("replacing", final_dir);
    fs::remove_all(old, ec);
  }
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(tmp_dir, ": cannot rename to ", final_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status lock_save_dir(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, int>* held = new std::map<std::string, int>();  // for the process
  std::error_code ec;
  const std::string key = fs::weakly_canonical(dir, ec).string();
  std::lock_guard<std::mutex> lock(mu);
  if (held->count(key) > 0) return absl::OkStatus();
  const std::string path = absl::StrCat(dir, "/.troupe-save.lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save ", dir, ": cannot open ", path, ": ", reason()));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const bool busy = errno == EWOULDBLOCK;
    const std::string why = reason();
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "--save ", dir,
        busy ? ": another run is saving checkpoints there (it holds " : ": cannot lock ", path,
        busy ? ")" : absl::StrCat(": ", why)));
  }
  (*held)[key] = fd;  // held until the process ends
  return absl::OkStatus();
}

absl::StatusOr<std::string> begin_save(const std::string& dir, int step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save ", dir, ": cannot make the directory: ", ec.message()));
  }
  if (absl::Status st = lock_save_dir(dir); !st.ok()) return st;
  // A save a crash interrupted left its temporary (and perhaps the
  // tracker's); only one save of a run is ever in flight, and no other run
  // saves here (the lock), so every one is stale.
  const std::string tracker_temp = absl::StrCat(".", kTracker, ".tmp.");
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_temp_name(name) || absl::StartsWith(name, tracker_temp)) fs::remove_all(e.path(), ec);
  }
  thread_local std::mt19937_64 random{std::random_device{}()};
  const std::string tmp =
      absl::StrCat(dir, "/", iter_name(step), ".tmp-", ::getpid(), "-", random() % 1000000000);
  if (!fs::create_directory(tmp, ec) || ec) {
    return absl::InternalError(
        absl::StrCat("--save ", dir, ": cannot make ", tmp, ": ", ec ? ec.message() : "it exists"));
  }
  debug_save_point("temporary made", tmp);
  return tmp;
}

absl::StatusOr<std::vector<TensorRecord>> write_rank_file(const std::string& tmp_dir, int rank,
                                                          const std::vector<Piece>& pieces) {
  std::vector<TensorRecord> records;
  std::vector<TensorToWrite> tensors;
  const std::string file = rank_file_name(rank);
  for (const Piece& p : pieces) {
    for (const ParamSpec& spec : p.layout->specs()) {
      if (p.tied_copy && spec.name == "wte.weight") continue;
      const std::int64_t b = std::max(p.begin, spec.offset);
      const std::int64_t e = std::min(p.end, spec.offset + spec.numel());
      if (b >= e) continue;
      TensorRecord r;
      r.file = file;
      r.name = absl::StrCat(kind_name(p.kind), "/", spec.name);
      r.param = spec.name;
      r.kind = p.kind;
      r.global_shape.assign(spec.full_shape.begin(), spec.full_shape.end());
      r.slice_shape.assign(spec.shape.begin(), spec.shape.end());
      r.split = spec.replicated() ? Split::kNone : spec.split;
      r.tp = spec.slice.tp;
      r.t = spec.slice.t;
      r.begin = b - spec.offset;
      r.end = e - spec.offset;
      const float* data = p.data + (b - p.begin);
      const std::size_t nbytes = static_cast<std::size_t>(e - b) * sizeof(float);
      r.crc32 = crc_of(data, nbytes);
      const bool whole = r.begin == 0 && r.end == spec.numel();
      tensors.push_back({.name = r.name,
                         .dtype = "F32",
                         .shape = whole ? r.slice_shape : std::vector<std::int64_t>{e - b},
                         .data = data,
                         .nbytes = nbytes});
      records.push_back(std::move(r));
    }
  }
  // The file describes itself too: the manifest's records of its tensors.
  std::map<std::string, std::string> metadata = {{"format", "troupe-checkpoint"},
                                                 {"rank", std::to_string(rank)},
                                                 {"tensors", records_to_text(records)}};
  if (absl::Status st = write_safetensors(absl::StrCat(tmp_dir, "/", file), tensors, metadata);
      !st.ok()) {
    return st;
  }
  debug_save_point("rank file written", absl::StrCat(tmp_dir, "/", file));
  return records;
}

absl::Status commit(const std::string& dir, const std::string& tmp_dir, const Meta& meta,
                    const std::vector<TensorRecord>& records, int keep_last) {
  const std::string manifest = manifest_text(meta, records);
  if (absl::Status st = write_file_atomically(absl::StrCat(tmp_dir, "/manifest.json"), manifest);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = fsync_path(tmp_dir); !st.ok()) return st;
  debug_save_point("manifest written", tmp_dir);
  const std::string final_dir = absl::StrCat(dir, "/", iter_name(meta.step));
  std::error_code ec;
  if (absl::Status st = move_into_place(dir, tmp_dir, final_dir, meta.step); !st.ok()) return st;
  if (absl::Status st = fsync_path(dir); !st.ok()) return st;
  debug_save_point("renamed", final_dir);
  // The tracker last: it names a complete checkpoint, the old or the new.
  if (absl::Status st =
          write_file_atomically(absl::StrCat(dir, "/", kTracker), absl::StrCat(meta.step, "\n"));
      !st.ok()) {
    return st;
  }
  debug_save_point("tracker written", absl::StrCat(dir, "/", kTracker, " (", meta.step, ")"));
  if (keep_last > 0) {
    std::vector<int> steps = complete_steps(dir);
    const int excess = static_cast<int>(steps.size()) - keep_last;
    for (int i = 0; i < excess; i++) {
      const int old = steps[static_cast<std::size_t>(i)];
      if (old == meta.step) continue;  // the tracker's: never
      // Renamed to a temporary's name first: a crash in the middle of the
      // removal leaves no partial checkpoint that looks complete.
      const std::string doomed =
          absl::StrCat(dir, "/", iter_name(old), ".tmp-removing-", ::getpid());
      fs::rename(absl::StrCat(dir, "/", iter_name(old)), doomed, ec);
      if (!ec) fs::remove_all(doomed, ec);
    }
  }
  return absl::OkStatus();
}

std::string records_to_text(const std::vector<TensorRecord>& records) {
  json a = json::array();
  for (const TensorRecord& r : records) a.push_back(record_json(r));
  return a.dump();
}

absl::StatusOr<std::vector<TensorRecord>> records_from_text(const std::string& text) {
  json a = json::parse(text, nullptr, false);
  if (a.is_discarded() || !a.is_array()) {
    return absl::InvalidArgumentError("tensor records: not a JSON array");
  }
  std::vector<TensorRecord> out;
  for (const json& j : a) {
    absl::StatusOr<TensorRecord> r = record_from_json(j);
    if (!r.ok()) return r.status();
    out.push_back(std::move(*r));
  }
  return out;
}

void add_chunk_pieces(const ParamLayout& layout, bool tied_copy, bool params,
                      std::int64_t part_begin, std::int64_t part_end, float* param_data,
                      float* master, float* adam_m, float* adam_v, std::vector<Piece>* out) {
  if (params) {
    out->push_back({.kind = Kind::kParam,
                    .layout = &layout,
                    .begin = 0,
                    .end = layout.total(),
                    .data = param_data,
                    .tied_copy = tied_copy});
  }
  if (part_begin >= part_end) return;
  const std::pair<Kind, float*> state[] = {
      {Kind::kMaster, master}, {Kind::kAdamM, adam_m}, {Kind::kAdamV, adam_v}};
  for (const auto& [kind, data] : state) {
    if (data == nullptr) continue;
    out->push_back({.kind = kind,
                    .layout = &layout,
                    .begin = part_begin,
                    .end = part_end,
                    .data = data,
                    .tied_copy = tied_copy});
  }
}

Snapshot Snapshot::take(const std::vector<Piece>& live) {
  Snapshot s;
  s.buffers_.reserve(live.size());
  for (const Piece& p : live) {
    s.buffers_.emplace_back(p.data, p.data + (p.end - p.begin));
    Piece copy = p;
    copy.data = s.buffers_.back().data();
    s.pieces_.push_back(copy);
  }
  return s;
}

void Snapshot::retake(const std::vector<Piece>& live) {
  bool same = live.size() == pieces_.size();
  for (std::size_t i = 0; same && i < live.size(); i++) {
    same = live[i].end - live[i].begin == pieces_[i].end - pieces_[i].begin;
  }
  if (!same) {
    *this = take(live);
    return;
  }
  for (std::size_t i = 0; i < live.size(); i++) {
    Piece copy = live[i];
    copy.data = buffers_[i].data();
    std::copy(live[i].data, live[i].data + (live[i].end - live[i].begin), copy.data);
    pieces_[i] = copy;
  }
}

std::int64_t Snapshot::bytes() const {
  std::int64_t n = 0;
  for (const auto& b : buffers_) n += static_cast<std::int64_t>(b.size() * sizeof(float));
  return n;
}

void BackgroundWrite::start(std::function<void()> write) {
  wait();
  thread_ = std::thread(std::move(write));
}

void BackgroundWrite::wait() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace troupe::model::ckpt
