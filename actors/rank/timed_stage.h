// A model chunk whose forward and backward only take time: each is a sleep
// of a fixed length on the stage's stream, and everything else (buffers,
// slots, gradient buckets, messages) is a real GptStage's. The pipeline
// benchmark measures the runtime's own overhead with it, and
// `--debug-op-cost FWD_MS:BWD_MS` runs a whole job with it (a schedule's
// bubble against its theory in `troupe trace`). The losses are 0.
//
//   actors::StageFactory f = actors::timed_stage_factory(10, 20);
//   auto t = actors::InProcessTrainer::create(options, parallel, f);
#pragma once

#include <atomic>
#include <cstdint>

#include "actors/rank/rank.h"
#include "actors/rank/stage_compute.h"

namespace troupe::actors {

class TimedStage : public GptStage {
 public:
  // `busy_ns` (may be null) adds up the time the sleeps took.
  TimedStage(const model::GptConfig& c, int B, const model::StageSpec& spec, int slots,
             double fwd_ms, double bwd_ms, std::atomic<std::int64_t>* busy_ns = nullptr);
  void forward(gpu::Stream& s, int slot, const gpu::Tensor& tokens,
               const gpu::Tensor& targets) override;
  void backward(gpu::Stream& s, int slot, const gpu::Tensor& tokens, const gpu::Tensor& targets,
                float dloss, const model::GradProgress& progress) override;

 private:
  void sleep_on(gpu::Stream& s, double ms);
  double fwd_ms_, bwd_ms_;
  std::atomic<std::int64_t>* busy_ns_;
};

StageFactory timed_stage_factory(double fwd_ms, double bwd_ms,
                                 std::atomic<std::int64_t>* busy_ns = nullptr);

}  // namespace troupe::actors
