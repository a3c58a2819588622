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
// The zero-bubble schedules (Qi et al., ICLR 2024) split each backward into
// B (OpKind::kBackward: the input gradient, on the critical path) and W
// (OpKind::kWeight: the weight gradients, which nothing waits for), and
// fill the bubbles with W:
//   ZbH1   1F1B's forwards and B's; stage s defers its first s W's, so its
//          last W's fill the cool-down's gaps: bubble (pp-1)(F+B-W) instead
//          of 1F1B's (pp-1)(F+B+W), at 1F1B's activation slots (pp-s) plus
//          s+1 weight stashes
//   ZbV    two chunks per stage in a V (stage s holds chunks s and
//          2pp-1-s: comm::Layout::v_shape), warm-up forwards of chunk 0,
//          then F/B/W of both chunks interleaved; with F = B = W the only
//          idle time is the last stage's wait for its first input,
//          (pp-1) chunk forwards (a bubble of (pp-1)/(6m+pp-1))
//   ZbAuto ZbH1's list (or, with --virtual-stages 2, ZbV's on its V), as
//          the order the stage starts from: the shard runs the next F or B
//          when its input is there and otherwise the oldest pending W
//          (actors/shard_actor.h), whatever the op times
// In the other schedules kBackward is the whole backward and no kWeight
// op appears.
//
//   auto ops = actors::make_schedule(actors::ScheduleKind::k1F1B, /*pp=*/4, /*s=*/1, /*m=*/8,
//   /*v=*/1); for (const actors::ScheduleOp& op : *ops) { ... op.kind, op.micro, op.chunk ... }
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/groups.h"

namespace troupe::actors {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kZbH1, kZbV, kZbAuto };
enum class OpKind { kForward, kBackward, kWeight };

struct ScheduleOp {
  OpKind kind = OpKind::kForward;
  int micro = 0;  // micro-batch
  int chunk = 0;  // model chunk on this stage (0 unless interleaved)
  int id = 0;     // position in the stage's list (for traces and waits)
  bool operator==(const ScheduleOp&) const = default;
};

// "gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "zb-auto"; InvalidArgument
// naming the choices.
absl::StatusOr<ScheduleKind> parse_schedule(const std::string& name);
std::string schedule_name(ScheduleKind kind);
// Whether the schedule runs each backward as B and W (kWeight ops).
bool splits_backward(ScheduleKind kind);
// Model chunks per stage the schedule needs: 2 for ZbV (its V), else the
// layout's --virtual-stages.
int chunks_per_stage(ScheduleKind kind, int virtual_stages);

// Stage s's ops for m micro-batches (v model chunks per stage; v = 1 unless
// interleaved, 2 for ZbV, 1 or 2 (the V) for ZbAuto). InvalidArgument for
// sizes out of range.
absl::StatusOr<std::vector<ScheduleOp>> make_schedule(ScheduleKind kind, int pp, int s, int m,
                                                      int v);

// The chunks per stage and their placement the schedule runs on: zbv
// places 2 chunks per stage in a V (--virtual-stages 1 or 2 accepted),
// zb-auto 1 chunk per stage or (--virtual-stages 2) zbv's V, the others as
// --virtual-stages says (more than 1 for interleaved only). InvalidArgument
// naming the flags.
absl::Status place_for_schedule(ScheduleKind kind, comm::Layout* layout);
// Whether `layout` is what place_for_schedule makes for `kind`.
absl::Status check_placement(ScheduleKind kind, const comm::Layout& layout);

// L layers must split into pp*v equal model chunks.
absl::Status check_layer_split(int L, int pp, int v);

// Most micro-batches model chunk `chunk` holds between its forward and its
// backward (B) in `ops` (one stage's list): the activation slots it needs.
int peak_in_flight(const std::vector<ScheduleOp>& ops, int chunk);
// Most micro-batches of `chunk` between their B and their W: the weight
// stashes it needs (0 where the list has no W).
int peak_pending_weights(const std::vector<ScheduleOp>& ops, int chunk);

// Forwards a stage runs before its first backward (Megatron's warm-up; for
// zbv, chunk 0's warm-up forwards only).
int warmup_forwards(ScheduleKind kind, int pp, int s, int m, int v);

}  // namespace troupe::actors
