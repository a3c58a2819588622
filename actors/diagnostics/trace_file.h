// A rank's trace file: what its Recorder (comm/trace.h) holds, as JSON Lines.
//
// DIR/rank-NNNNN.trace.jsonl (5-digit global rank). Line 1 is the header:
//   {"format":"troupe-trace","version":1,"rank":3,"d":0,"s":1,"t":0,
//    "host":"h","pid":1234,"layout":{"tp":1,"pp":4,"dp":1,"v":1},
//    "schedule":"1f1b","m":8,"reason":"end"|"failure"|"stall"|"signal",
//    "message":"...","clock":{"offset_ns":0,"uncertainty_ns":0},
//    "capacity":262144,"recorded":N,"dropped":K,"trace_steps":[A,B]|null}
// then one event per line in the order they ended, then the open events
// ("open":true, no "e"). Every event has "k" (kind), "b", "e" (ns of this
// rank's steady clock; add clock.offset_ns for the coordinator's clock) and
// "step"; the other keys by kind are in docs/ARCHITECTURE.md (Tracing).
// Written atomically (model::AtomicFile).
//
//   actors::TraceHeader h{.rank = 3, .coord = {0, 1, 0}, ...};
//   absl::Status st = actors::write_trace_file("runs/x/trace", h, recorder);
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "actors/schedule.h"
#include "comm/groups.h"
#include "comm/trace.h"

namespace troupe::actors {

struct TraceHeader {
  int rank = 0;
  comm::Coord coord;
  std::string host;
  int pid = 0;
  comm::Layout layout;
  int virtual_stages = 1;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int m = 1;
  std::string reason = "end";  // end | failure | stall | signal
  std::string message;
  std::int64_t clock_offset_ns = 0;       // add to this rank's times: the coordinator's clock
  std::int64_t clock_uncertainty_ns = 0;  // half the best probe's round trip
};

// "rank-00003.trace.jsonl".
std::string trace_file_name(int rank);
// One event as its JSON line (no newline).
std::string trace_event_json(const comm::trace::Event& e, bool open);
// Writes DIR/trace_file_name(rank), making DIR if needed.
absl::Status write_trace_file(const std::string& dir, const TraceHeader& header,
                              const comm::trace::Recorder& recorder);
// Removes the rank files (rank-*.trace.jsonl) an earlier run left in `dir`,
// so that a trace never mixes two runs (or a restart's attempts): the
// launcher (`troupe train`, `troupe launch` before each start) calls it.
void remove_trace_files(const std::string& dir);
// Where a run without a run directory or --trace puts its flight recorder:
// ./troupe-flight-<YYYYmmdd-HHMMSS>-<pid> (absolute), fixed per process;
// under $TROUPE_FLIGHT_DIR instead of ./ when that is set (the tests).
std::string default_flight_dir();
// What a failure message says about the files: "flight recorder: DIR
// (rank-*.trace.jsonl; read them with `troupe trace DIR`)", or why they
// could not be written.
std::string flight_note(const std::string& dir, const absl::Status& written);

}  // namespace troupe::actors
