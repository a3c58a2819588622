// GPipe, 1F1B and interleaved 1F1B, as Megatron-LM orders them.
#include "actors/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "actors/schedule_zb.h"

namespace troupe::actors {

absl::StatusOr<ScheduleKind> parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved1F1B;
  if (name == "zb-h1") return ScheduleKind::kZbH1;
  if (name == "zbv") return ScheduleKind::kZbV;
  if (name == "zb-auto") return ScheduleKind::kZbAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "--schedule '", name, "': choose gpipe, 1f1b, interleaved, zb-h1, zbv or zb-auto"));
}

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::kZbH1 || kind == ScheduleKind::kZbV || kind == ScheduleKind::kZbAuto;
}

int chunks_per_stage(ScheduleKind kind, int virtual_stages) {
  return kind == ScheduleKind::kZbV ? 2 : virtual_stages;
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved";
    case ScheduleKind::kZbH1:
      return "zb-h1";
    case ScheduleKind::kZbV:
      return "zbv";
    case ScheduleKind::kZbAuto:
      return "zb-auto";
  }
  return "?";
}

absl::Status place_for_schedule(ScheduleKind kind, comm::Layout* layout) {
  if (kind == ScheduleKind::kZbAuto && layout->virtual_stages > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule zb-auto runs zb-h1's order on one model chunk per stage, or "
                     "(--virtual-stages 2) zbv's on two in a V; --virtual-stages ",
                     layout->virtual_stages, " does not fit it"));
  }
  if (kind == ScheduleKind::kZbV ||
      (kind == ScheduleKind::kZbAuto && layout->virtual_stages == 2)) {
    if (layout->pp < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--schedule ", schedule_name(kind),
          kind == ScheduleKind::kZbAuto ? " --virtual-stages 2" : "",
          " places 2 model chunks per stage in a V across the pipeline's stages; --pp ", layout->pp,
          " has none (use --pp 2 or more)"));
    }
    if (layout->virtual_stages != 1 && layout->virtual_stages != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--schedule zbv places 2 model chunks on each stage in a V; ",
                       "--virtual-stages ", layout->virtual_stages, " does not fit it"));
    }
    layout->virtual_stages = 2;
    layout->v_shape = true;
    return absl::OkStatus();
  }
  layout->v_shape = false;
  return check_placement(kind, *layout);
}

absl::Status check_placement(ScheduleKind kind, const comm::Layout& layout) {
  if (kind == ScheduleKind::kZbAuto && layout.virtual_stages == 2) {
    if (layout.v_shape) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "--schedule zb-auto --virtual-stages 2 runs 2 model chunks per stage placed in a V "
        "(actors::place_for_schedule sets the layout)");
  }
  if (kind == ScheduleKind::kZbV) {
    if (layout.v_shape && layout.virtual_stages == 2) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "--schedule zbv runs 2 model chunks per stage placed in a V "
        "(actors::place_for_schedule sets the layout)");
  }
  if (layout.v_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("a V placement is zbv's (and zb-auto's with --virtual-stages 2), not "
                     "--schedule ",
                     schedule_name(kind), "'s"));
  }
  if (layout.virtual_stages > 1 && kind != ScheduleKind::kInterleaved1F1B) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual-stages ", layout.virtual_stages, " needs --schedule interleaved"));
  }
  return absl::OkStatus();
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
    case ScheduleKind::kZbH1:
      return std::min(pp - s - 1, m);
    case ScheduleKind::kZbAuto:
      return v == 2 ? std::min(2 * (pp - s) - 1, m) : std::min(pp - s - 1, m);
    case ScheduleKind::kZbV:
      return std::min(2 * (pp - s) - 1, m);
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
  if (kind == ScheduleKind::kZbAuto && v == 2) return zbv_schedule(pp, s, m);
  if (kind == ScheduleKind::kZbV) {
    if (v != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--schedule zbv runs 2 model chunks per stage, not ", v));
    }
    return zbv_schedule(pp, s, m);
  }
  if (kind != ScheduleKind::kInterleaved1F1B && v != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual-stages ", v, " needs --schedule interleaved"));
  }
  if (kind == ScheduleKind::kZbH1 || kind == ScheduleKind::kZbAuto) return zbh1_schedule(pp, s, m);
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

namespace {

// Most of `chunk`'s micro-batches between an op of kind `from` and one of `to`.
int peak_between(const std::vector<ScheduleOp>& ops, int chunk, OpKind from, OpKind to) {
  int now = 0, peak = 0;
  for (const ScheduleOp& op : ops) {
    if (op.chunk != chunk) continue;
    if (op.kind == from) now++;
    if (op.kind == to) now--;
    peak = std::max(peak, now);
  }
  return peak;
}

}  // namespace

int peak_in_flight(const std::vector<ScheduleOp>& ops, int chunk) {
  return peak_between(ops, chunk, OpKind::kForward, OpKind::kBackward);
}

int peak_pending_weights(const std::vector<ScheduleOp>& ops, int chunk) {
  const bool split = std::any_of(ops.begin(), ops.end(),
                                 [](const ScheduleOp& op) { return op.kind == OpKind::kWeight; });
  return split ? peak_between(ops, chunk, OpKind::kBackward, OpKind::kWeight) : 0;
}

}  // namespace troupe::actors
