// A cost model by hand for the planner's simulation tests (plan_test.cc,
// plan_p2p_test.cc), and the layouts they simulate.
#pragma once

#include "actors/schedule.h"
#include "launcher/plan/cost.h"
#include "model/config.h"

namespace troupe::launcher::plan {

// Every chunk costs f forward and b backward per layer (the LM head's
// chunk `head` times that); messages and the optimizer cost nothing (or
// `hop` per message).
class FixedCosts final : public Costs {
 public:
  FixedCosts(double f, double b, double hop = 0, double head = 1)
      : f_(f), b_(b), hop_(hop), head_(head) {}
  ChunkCost chunk(const model::StageSpec& spec) const override {
    ChunkCost c;
    c.fwd = f_ * spec.layers() * (spec.head ? head_ : 1);
    c.bwd = b_ * spec.layers() * (spec.head ? head_ : 1);
    return c;
  }
  double p2p_seconds(int, int) const override { return hop_; }
  double dp_reduce_seconds(int, double) const override { return 0; }
  double dp_gather_seconds(int, double) const override { return 0; }
  double optimizer_seconds(double) const override { return 0; }

 private:
  double f_, b_, hop_, head_;
};

inline PlanInput layout(int L, int pp, int m, actors::ScheduleKind kind, int v = 1) {
  PlanInput in;
  in.model = *model::preset("tiny");
  in.model.L = L;
  in.parallel.pp = pp;
  in.parallel.schedule = kind;
  in.parallel.virtual_stages = v;
  in.micro_batch = 1;
  in.global_batch = m;
  return in;
}

}  // namespace troupe::launcher::plan
