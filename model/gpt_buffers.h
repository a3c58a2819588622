// Gpt's buffers (internal to model/): how its parameters, activation
// slots, recompute workspace, scratch and weight-gradient stashes are carved
// out of one allocation each, and the byte counts the planner reads
// (model/gpt.h: counted_*_bytes). Not part of the public model API.
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/device.h"
#include "gpu/tensor.h"
#include "model/config.h"
#include "model/gpt.h"
#include "model/layout.h"

namespace troupe::model::buffers {

using gpu::Tensor;

// Carves tensors out of one allocation, counting its bytes: activations
// and their gradients in the compute dtype (take), statistics in f32
// (take32), each from a 64-byte boundary.
class Carver {
 public:
  Carver(std::int64_t* total_bytes, gpu::DType act) : total_(total_bytes), act_(act) {}
  void bind(Tensor flat) { flat_ = std::move(flat); }
  Tensor take(const gpu::Shape& shape) { return take_as(act_, shape); }
  Tensor take32(const gpu::Shape& shape) { return take_as(gpu::DType::kF32, shape); }

 private:
  Tensor take_as(gpu::DType dtype, const gpu::Shape& shape) {
    const auto bytes = gpu::shape_numel(shape) * static_cast<std::int64_t>(gpu::dtype_size(dtype));
    Tensor t;
    if (flat_.defined()) t = flat_.view_as(dtype, *total_, shape);
    *total_ += (bytes + 63) / 64 * 64;
    return t;
  }
  std::int64_t* total_;
  gpu::DType act_;
  Tensor flat_;
};

// One allocation of `bytes` (a multiple of 64) for a Carver.
Tensor allocate_bytes(gpu::Device& device, std::int64_t bytes);

// How layer l of a chunk of L layers keeps its activations.
struct LayerKeep {
  enum class Mode { kAll, kNoScores, kRecomputed };
  Mode mode = Mode::kAll;
  int pos = 0;               // kRecomputed: position in its group (the workspace layer)
  int group_first = 0;       // kRecomputed: the group's first layer
  bool keeps_output = true;  // kRecomputed: the group's last layer (its output is kept)
};

LayerKeep layer_keep(const ActivationOptions& o, int L, int l);

GptActivations carve_activations(const GptConfig& c, const StageSpec& stage, std::int64_t B, int tp,
                                 const ActivationOptions& o, Carver& k);
GptScratch carve_scratch(const GptConfig& c, const StageSpec& stage, std::int64_t B, int tp,
                         const ActivationOptions& o, Carver& k);
std::vector<LayerActivations> carve_workspace(const GptConfig& c, const StageSpec& stage,
                                              std::int64_t B, int tp, const ActivationOptions& o,
                                              Carver& k);

}  // namespace troupe::model::buffers
