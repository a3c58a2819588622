// Single-rank GPT training: data, model, AdamW and the step loop on one
// stream. The actors of later issues run the same steps split across ranks;
// this loop is the reference they must agree with.
//
//   absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::create(options);
//   for (int i = 0; i < options.steps; i++) {
//     StepMetrics m;
//     RETURN_IF_ERROR((*t)->step(&m));
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/device.h"
#include "model/config.h"
#include "model/data/loader.h"
#include "model/gpt.h"
#include "model/optimizer.h"

namespace troupe::model {

struct TrainOptions {
  GptConfig model;
  int micro_batch = 4;    // --micro-batch-size (B)
  int global_batch = 0;   // --global-batch-size; 0 = micro_batch
  int steps = 10;
  LrSchedule lr;
  AdamWConfig adam;
  float clip_grad = 1.0f;  // <= 0: no clipping
  std::uint64_t seed = 1234;
  std::string data_path;   // Megatron prefix; empty: the synthetic phrase corpus
  bool shuffle = true;
  std::string init_weights;  // safetensors to start from; empty: initialise from seed
  int threads = 0;           // compute stream's threads; 0 = all cores

  int grad_accum() const { return global_batch / micro_batch; }
  // InvalidArgument naming the flag when options do not fit together.
  absl::Status validate() const;
};

struct StepMetrics {
  int step = 0;             // 1-based optimizer step
  double loss = 0;          // mean cross-entropy over all GBS*T tokens, before the update
  double grad_norm = 0;     // L2 norm of that loss's gradient, before clipping
  float lr = 0;
  double step_s = 0;        // wall time of this step
  double tokens_per_s = 0;  // GBS*T / step_s
};

class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> create(const TrainOptions& options);

  // One optimizer step: m micro-batches forward and backward, gradient norm,
  // clipping, AdamW. Fails on bad data or a stream error.
  absl::Status step(StepMetrics* metrics);
  // Forward only: mean loss of the micro-batch (tokens, targets: (B, T)).
  absl::StatusOr<double> evaluate(const std::vector<std::int32_t>& tokens,
                                  const std::vector<std::int32_t>& targets);

  Gpt& gpt() { return *gpt_; }
  const TrainOptions& options() const { return options_; }
  gpu::Stream& stream() { return *stream_; }
  const data::GptLoader& loader() const { return *loader_; }
  int steps_done() const { return steps_done_; }

 private:
  Trainer() = default;

  TrainOptions options_;
  std::unique_ptr<gpu::Stream> stream_;
  std::unique_ptr<Gpt> gpt_;
  std::unique_ptr<AdamW> adam_;
  std::unique_ptr<data::GptLoader> loader_;
  std::vector<gpu::Tensor> tokens_, targets_;  // one (B, T) pair per micro-batch
  gpu::Tensor norm_;                           // f64[1]
  int steps_done_ = 0;
};

}  // namespace troupe::model
