// Pipeline schedules as data: the ordered list of forward and backward ops
// one pipeline stage runs in a training step. Every tensor-parallel peer of a
// stage walks the same list, so their collectives come in the same order.
//
//   GPipe            all m forwards, then all m backwards
//   1F1B             PipeDream-flush in Megatron's order: pp-s-1 warm-up
//                    forwards, then one forward one backward, then cool-down
//   Interleaved1F1B  v model chunks per stage (stage s holds chunks
//                    s, s+pp, s+2pp, ...); m must be a multiple of pp
//
//   auto ops = actors::make_schedule(actors::ScheduleKind::k1F1B, /*pp=*/4, /*s=*/1, /*m=*/8,
//   /*v=*/1); for (const actors::ScheduleOp& op : *ops) { ... op.kind, op.micro, op.chunk ... }
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::actors {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B };
enum class OpKind { kForward, kBackward };

struct ScheduleOp {
  OpKind kind = OpKind::kForward;
  int micro = 0;  // micro-batch
  int chunk = 0;  // model chunk on this stage (0 unless interleaved)
  int id = 0;     // position in the stage's list (for traces and waits)
  bool operator==(const ScheduleOp&) const = default;
};

// "gpipe", "1f1b", "interleaved"; InvalidArgument naming the choices.
absl::StatusOr<ScheduleKind> parse_schedule(const std::string& name);
std::string schedule_name(ScheduleKind kind);

// Stage s's ops for m micro-batches (v model chunks per stage; v = 1 unless
// interleaved). InvalidArgument for sizes out of range.
absl::StatusOr<std::vector<ScheduleOp>> make_schedule(ScheduleKind kind, int pp, int s, int m,
                                                      int v);

// L layers must split into pp*v equal model chunks.
absl::Status check_layer_split(int L, int pp, int v);

// Most micro-batches model chunk `chunk` holds between its forward and its
// backward in `ops` (one stage's list): the activation slots it needs.
int peak_in_flight(const std::vector<ScheduleOp>& ops, int chunk);

// Forwards a stage runs before its first backward (Megatron's warm-up).
int warmup_forwards(ScheduleKind kind, int pp, int s, int m, int v);

}  // namespace troupe::actors
