// Generation and evaluation on a tp × pp layout in this process: a
// model::Decoder per (s, t) with its own stream, the TP groups' collectives
// over the in-process transport (actors/rank/tensor_link.h), and the stage
// boundary an explicit copy of a stage's output to the next stage's input.
// The head's vocabulary slices are gathered over the TP group and read by
// one caller, so sampling happens in one place with one generator whatever
// the layout.
//
//   auto lm = actors::ShardedModel::create(config, {.tp = 2, .pp = 2},
//       [&](const model::GptConfig& c, const model::ParamLayout& l, float* p) {
//         return model::load_weights_slice(path, c, l, p);
//       });
//   absl::StatusOr<model::Generated> g = model::generate(**lm, prompt, options);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/groups.h"
#include "gpu/device.h"
#include "gpu/precision.h"
#include "model/config.h"
#include "model/generation.h"
#include "model/layout.h"

namespace troupe::actors {

// Where the shards compute: `device` (null: the CPU; a device must
// outlive the model; on a GPU tp = 1, as the in-process TP collectives are
// the CPU's) in `precision` (Megatron's inference in the trained
// precision: bf16/fp16 parameters, KV cache, activations and logits; the
// logits are widened to fp32 for sampling).
struct InferenceOptions {
  gpu::Device* device = nullptr;
  gpu::Precision precision = gpu::Precision::kFp32;
  int threads = 1;                                                      // per shard, on the CPU
  model::AttentionKernel attention = model::AttentionKernel::kDefault;  // the device's
};

// Fills one shard's parameters: layout.total() floats of host memory for
// `layout` (a stage's TP slice of `config`, the model as the shards hold
// it: its vocabulary padded for tp), as model::load_weights_slice reads them.
using ParamLoader = std::function<absl::Status(const model::GptConfig& config,
                                               const model::ParamLayout& layout, float* params)>;

class ShardedModel final : public model::LanguageModel {
 public:
  // `config` as trained; the vocabulary is padded for tp as training pads
  // it (actors::ParallelOptions::sliced_config). InvalidArgument naming
  // --tp or --pp when the layout does not fit the model.
  static absl::StatusOr<std::unique_ptr<ShardedModel>> create(const model::GptConfig& config,
                                                              comm::Layout layout,
                                                              const ParamLoader& load,
                                                              const InferenceOptions& options = {});
  ~ShardedModel() override;

  int context() const override { return config_.T; }
  int vocab() const override { return config_.V; }
  const model::GptConfig& config() const { return config_; }
  comm::Layout layout() const { return layout_; }

  // One sequence (B = 1). Ids outside [0, V) and positions outside [0, T)
  // are InvalidArgument, and a pos past the positions fed so far (a gap in
  // the cache) FailedPrecondition, checked before anything runs.
  absl::StatusOr<std::span<const float>> forward(std::span<const std::int32_t> tokens,
                                                 std::int64_t pos, model::Logits which) override;

 private:
  struct Shard;
  ShardedModel() = default;
  Shard& shard(int s, int t) { return *shards_[static_cast<std::size_t>(s * layout_.tp + t)]; }

  model::GptConfig config_;
  comm::Layout layout_;
  gpu::Device* device_ = nullptr;
  std::shared_ptr<void> fabric_;  // the in-process transport's fabric (comm::InProcFabric)
  std::vector<std::unique_ptr<Shard>> shards_;  // s-major: (s, t) at s * tp + t
  std::vector<float> boundary_;                 // a stage's output on its way to the next (n × C)
  std::vector<float> gathered_;                 // the head's (tp, rows, Vl) logits
  std::vector<float> logits_;                   // rows × V, returned
  std::int64_t fed_ = 0;                        // positions the caches hold
};

}  // namespace troupe::actors
