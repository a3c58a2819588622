// A model chunk whose forward and backward only take time: each op is a
// sleep of a fixed length on the stage's stream, and everything else
// (buffers, slots, stashes, gradient buckets, messages) is a real
// GptStage's. The pipeline benchmark measures the runtime's own overhead
// with it, and `--debug-op-cost F:B:W` runs a whole job with it (a
// schedule's bubble against its theory in `troupe trace`); `--debug-op-jitter
// X` varies each op's time by up to +-X of it, reproducibly. The losses are 0.
//
//   actors::OpCosts costs{.stages = {{.f = 10, .b = 10, .w = 10}}};
//   auto t = actors::InProcessTrainer::create(options, parallel,
//   actors::timed_stage_factory(costs));
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/rank/rank.h"
#include "actors/rank/stage_compute.h"

namespace troupe::actors {

// A stage's op times in milliseconds: forward, B (the input gradient) and
// W (the weight gradients); the whole backward takes B + W.
struct OpCost {
  double f = 0, b = 0, w = 0;
  bool operator==(const OpCost&) const = default;
};

struct OpCosts {
  std::vector<OpCost> stages;  // one for every stage, or one per pipeline stage
  double jitter = 0;           // each op takes its time x (1 + u * jitter), u uniform in [-1, 1]
  std::uint64_t seed = 0;      // of the jitter's draws
  const OpCost& of(int stage) const {
    return stages[stages.size() == 1 ? 0 : static_cast<std::size_t>(stage)];
  }
};

// `text`: F:B:W, or FWD:BWD (the backward split evenly between B and W), in
// milliseconds; a comma-separated list gives one per pipeline stage.
// InvalidArgument naming `flag`.
absl::StatusOr<std::vector<OpCost>> parse_op_costs(const std::string& text,
                                                   const std::string& flag);

class TimedStage : public GptStage {
 public:
  // `busy_ns` (may be null) adds up the time the sleeps took.
  TimedStage(const StageRequest& r, const OpCost& cost, double jitter, std::uint64_t seed,
             std::atomic<std::int64_t>* busy_ns = nullptr);
  void forward(gpu::Stream& s, int slot, const gpu::Tensor& tokens,
               const gpu::Tensor& targets) override;
  void backward(gpu::Stream& s, int slot, const gpu::Tensor& tokens, const gpu::Tensor& targets,
                float dloss, const model::GradProgress& progress, bool finishes_step) override;
  void backward_input(gpu::Stream& s, int slot, int stash, const gpu::Tensor& tokens,
                      const gpu::Tensor& targets, float dloss, bool finishes_step) override;
  void backward_weight(gpu::Stream& s, int stash, int first, int count,
                       const model::GradProgress& progress) override;
  int weight_pieces() const override { return std::max(1, spec().layers()); }

 private:
  enum Kind { kF, kB, kW };
  // The k-th op of `kind` of this chunk's run: its cost with its jitter.
  double draw(Kind kind, std::int64_t k) const;
  void sleep_on(gpu::Stream& s, double ms);
  // Tells `progress` the points of W's pieces [first, last).
  void points(int first, int last, const model::GradProgress& progress) const;
  OpCost cost_;
  double jitter_;
  std::uint64_t seed_;
  std::int64_t count_[3] = {0, 0, 0};  // ops of each kind so far (W: pieces)
  std::atomic<std::int64_t>* busy_ns_;
};

StageFactory timed_stage_factory(OpCosts costs, std::atomic<std::int64_t>* busy_ns = nullptr);

}  // namespace troupe::actors
