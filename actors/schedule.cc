// GPipe, 1F1B and interleaved 1F1B, as Megatron-LM orders them.
#include "actors/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace troupe::actors {

absl::StatusOr<ScheduleKind> parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved1F1B;
  return absl::InvalidArgumentError(
      absl::StrCat("--schedule '", name, "': choose gpipe, 1f1b or interleaved"));
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved";
  }
  return "?";
}

absl::Status check_layer_split(int L, int pp, int v) {
  if (pp < 1 || v < 1 || L % (pp * v) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--layers ", L, " does not split into --pp ", pp,
                                                   " x --virtual-stages ", v, " = ", pp * v,
                                                   " equal model chunks"));
  }
  return absl::OkStatus();
}

int warmup_forwards(ScheduleKind kind, int pp, int s, int m, int v) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return m;
    case ScheduleKind::k1F1B:
      return std::min(pp - s - 1, m);
    case ScheduleKind::kInterleaved1F1B:
      // Megatron: all forwards first when m == pp; else enough to fill the
      // pipeline across the v chunks.
      if (m == pp) return m * v;
      return std::min((pp - s - 1) * 2 + (v - 1) * pp, m * v);
  }
  return 0;
}

namespace {

// Interleaved: the k-th forward (or backward) of a stage in Megatron's order.
// Micro-batches go in groups of pp through chunk 0, then chunk 1, ...;
// backwards walk the chunks in reverse.
ScheduleOp virtual_op(OpKind kind, int k, int pp, int v) {
  const int in_group = k % (pp * v);
  int chunk = in_group / pp;
  if (kind == OpKind::kBackward) chunk = v - 1 - chunk;
  const int micro = (k / (pp * v)) * pp + k % pp;
  return {kind, micro, chunk, 0};
}

}  // namespace

absl::StatusOr<std::vector<ScheduleOp>> make_schedule(ScheduleKind kind, int pp, int s, int m,
                                                      int v) {
  if (pp < 1 || s < 0 || s >= pp || m < 1 || v < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: pp=", pp, " s=", s, " m=", m, " v=", v, " out of range"));
  }
  if (kind != ScheduleKind::kInterleaved1F1B && v != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual-stages ", v, " needs --schedule interleaved"));
  }
  if (kind == ScheduleKind::kInterleaved1F1B && m % pp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved schedule: the ", m,
                     " micro-batches per step must be a multiple of --pp ", pp));
  }
  const int total = m * v;
  const int warmup = warmup_forwards(kind, pp, s, m, v);
  auto fwd = [&](int k) {
    return kind == ScheduleKind::kInterleaved1F1B ? virtual_op(OpKind::kForward, k, pp, v)
                                                  : ScheduleOp{OpKind::kForward, k, 0, 0};
  };
  auto bwd = [&](int k) {
    return kind == ScheduleKind::kInterleaved1F1B ? virtual_op(OpKind::kBackward, k, pp, v)
                                                  : ScheduleOp{OpKind::kBackward, k, 0, 0};
  };
  std::vector<ScheduleOp> ops;
  ops.reserve(static_cast<std::size_t>(2 * total));
  for (int k = 0; k < warmup; k++) ops.push_back(fwd(k));  // warm-up
  for (int k = 0; k < total - warmup; k++) {               // steady: 1F1B
    ops.push_back(fwd(warmup + k));
    ops.push_back(bwd(k));
  }
  for (int k = total - warmup; k < total; k++) ops.push_back(bwd(k));  // cool-down
  for (std::size_t i = 0; i < ops.size(); i++) ops[i].id = static_cast<int>(i);
  return ops;
}

int peak_in_flight(const std::vector<ScheduleOp>& ops, int chunk) {
  int now = 0, peak = 0;
  for (const ScheduleOp& op : ops) {
    if (op.chunk != chunk) continue;
    now += op.kind == OpKind::kForward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

}  // namespace troupe::actors
