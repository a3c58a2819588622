// The planner's discrete-event simulation of one training step, in virtual
// time. It runs what the actors run for one pipeline replica (every replica
// and TP peer does the same): each stage walks make_schedule's op list; an
// op fires when the stage is free and its input has arrived (the
// activation from the previous virtual stage, the gradient from the next),
// and its output leaves at once as a message that arrives one hop later
// (PlanInput::blocking_p2p: once the receiver has posted the receive, the
// sender held until then and through the hop);
// TP collectives are inside the ops' costs. The last backward of each
// chunk makes its gradient buckets final one after the other (head,
// layers last first, embedding) and each goes to the DP reduction at once,
// queued on the stage's DP link, so the reduction overlaps the rest of the
// backward as the runtime's does. Once every partition has reduced
// (the global norm waits for all), each steps AdamW on its 1/dp part and
// the parameters are all-gathered: the step ends when the last stage has
// its parameters back.
//
// Zero-bubble schedules run B and W as their lists say (buckets behind a
// chunk's last W). zb-auto is simulated by its rule (actors/shard_actor.h):
// the next F or B when its input is there, else the oldest pending W a
// layer's piece at a time (a piece that would not end before the input is
// due waits, unless the next B's chunk has all its stashes held). The step
// is simulated first greedy (what the runtime does before it has
// measured), then again with the input gaps each pass measured, until they
// hold still (the runtime's steady state; about pp passes), and the last
// pass is the result.
//
//   plan::CostModel cost(in, cluster, device);
//   absl::StatusOr<plan::SimResult> r = plan::simulate(in, cost, /*record=*/false);
//   r->step_s, r->bubble, r->exposed_comm_s
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "launcher/plan/cost.h"

namespace troupe::launcher::plan {

struct SimOp {
  int stage = 0, chunk = 0, micro = 0;
  bool backward = false;  // B (or the whole backward) or W
  bool weight = false;    // W (or a piece of it)
  double begin = 0, end = 0;
};

struct SimMessage {
  int from_stage = 0, to_stage = 0;
  bool backward = false;
  double sent = 0, arrived = 0;
};

struct SimResult {
  double step_s = 0;      // begin of the step to the last stage's parameters back
  double pipeline_s = 0;  // to the last op of any stage
  double bubble = 0;      // 1 - mean stage busy / pipeline_s
  // The communication nobody hid on `exposed_stage`, the stage with the
  // most time not computing (the one that waits most): its TP collectives
  // inside ops, the part of its waits for pipeline messages that was their
  // flight (blocking p2p: also the time its sends held it past its ops),
  // and its DP reduction and parameter return past its last op.
  double exposed_comm_s = 0;
  double tp_comm_s = 0, p2p_exposed_s = 0, dp_exposed_s = 0;
  double optimizer_s = 0;  // AdamW and norm on that stage
  int exposed_stage = 0;
  std::vector<double> busy_s;  // per stage
  // Per stage, per model chunk: one forward and one backward (TP inside).
  struct ChunkTimes {
    double fwd_s = 0, bwd_s = 0, tp_fwd_s = 0, tp_bwd_s = 0;
  };
  std::vector<std::vector<ChunkTimes>> chunks;
  std::vector<SimOp> ops;  // with record
  std::vector<SimMessage> messages;
};

// InvalidArgument when the layout cannot run (the schedule refuses it).
absl::StatusOr<SimResult> simulate(const PlanInput& in, const Costs& cost, bool record);

}  // namespace troupe::launcher::plan
