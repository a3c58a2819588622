// The per-rank trace files the runtime writes (--trace DIR, the flight
// recorder), read and checked: DIR/rank-NNNNN.trace.jsonl, JSON Lines, a
// header line then one event per line in completion order
// (docs/ARCHITECTURE.md, "launcher/: troupe trace", has the format).
//
//   absl::StatusOr<trace::Trace> t = trace::read_trace("runs/x/trace");
//   if (!t.ok()) return t.status();  // "runs/x/trace/rank-00001.trace.jsonl:7: ..."
//   for (const trace::RankTrace& r : t->ranks) ... r.events ...
//
// Every event's times are put on the coordinator's clock here (the header's
// clock.offset_ns added), so all ranks' times compare. Unknown kinds and
// keys are skipped (forward compatibility); anything that is not a trace
// (bad header, bad JSON, a missing or mistyped field) is an error naming
// the file and line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/trace.h"

namespace troupe::launcher::trace {

// The kinds the runtime records (comm/trace.h), by the names it writes.
using Kind = comm::trace::Kind;
using comm::trace::kind_name;

// One line of a rank file. Fields a kind does not have keep their defaults.
struct Event {
  Kind kind = Kind::kForward;
  std::int64_t b = 0;  // begin, ns on the coordinator's clock
  std::int64_t e = 0;  // end, likewise; == b when open
  bool open = false;   // still in progress when the file was written
  int step = 0;
  int mb = -1, chunk = -1, vs = -1;  // micro-batch, model chunk, virtual stage
  int m = -1;                        // step: its micro-batches per replica (a ramp-up's)
  bool eval = false;
  int peer = -1;    // send/recv: the other global rank; wait: -1 if none
  std::string msg;  // send/recv: activation | gradient | grad-piece | ...
  int layer = -1;   // grad/param piece: bucket or wte flag
  std::int64_t bytes = 0;
  std::string tag;                                 // send/recv: "0x..." (64-bit transport tag)
  std::string status;                              // send/recv: "ok" or the error text
  std::string group, op, name, actor, what, pass;  // collective/phase/optimizer/wait/step
  int seq = -1;  // collective (per rank) or the phase's collective
  int line = 0;  // line in its file (1-based), for messages

  std::int64_t duration() const { return e - b; }
  bool compute() const {
    return kind == Kind::kForward || kind == Kind::kBackward || kind == Kind::kWeight;
  }
};

struct Header {
  int rank = 0, d = 0, s = 0, t = 0;
  std::string host;
  std::int64_t pid = 0;
  int tp = 1, pp = 1, dp = 1, v = 1;  // layout; v: model chunks per rank
  std::string schedule;               // 1f1b | gpipe | interleaved
  int m = 0;                          // micro-batches per step
  std::string reason;                 // end | failure | stall | signal
  std::string message;
  std::int64_t offset_ns = 0, uncertainty_ns = 0;
  std::int64_t capacity = 0, recorded = 0, dropped = 0;
  std::optional<std::pair<int, int>> trace_steps;  // --trace-steps A:B

  std::string coord() const;     // "(d,s,t)"
  std::string describe() const;  // "rank 3 (0,1,0) host"
};

struct RankTrace {
  std::string path;
  Header header;
  std::vector<Event> events;  // file order (completion order)
  int skipped_unknown = 0;    // lines of kinds this reader does not know
};

struct Trace {
  std::string dir;
  std::vector<RankTrace> ranks;       // by global rank, each rank at most once
  std::vector<std::string> warnings;  // missing ranks, dropped events, mixed layouts

  const RankTrace* find(int rank) const;
  // The earliest begin of any event (aligned): the origin of printed times.
  std::int64_t origin() const;
  // The largest clock uncertainty of any rank.
  std::int64_t uncertainty_ns() const;
};

// One file's text, `path` naming it in errors.
absl::StatusOr<RankTrace> parse_rank_file(const std::string& path, absl::string_view text);
// Every DIR/rank-NNNNN.trace.jsonl, checked against each other (one layout,
// schedule and m; a file's rank as its name says).
absl::StatusOr<Trace> read_trace(const std::string& dir);
// The same from files already parsed (tests).
absl::StatusOr<Trace> assemble_trace(std::string dir, std::vector<RankTrace> ranks);

}  // namespace troupe::launcher::trace
