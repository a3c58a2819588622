// A GPT model chunk as a shard actor drives it.
#include "actors/rank/stage_compute.h"

namespace troupe::actors {

GptStage::GptStage(const model::GptConfig& config, int B, const model::StageSpec& spec, int slots,
                   gpu::Device& device, model::TensorParallel tp,
                   const model::ActivationOptions& activations, int stashes)
    : gpt_(config, B, device, spec, slots, std::move(tp), activations, stashes) {
  // A boundary tensor is the region's rows: with sequence parallelism this
  // rank's 1/tp of them (what Megatron sends between stages too).
  const int parts = activations.sequence_parallel ? gpt_.tp().tp : 1;
  const gpu::Shape btc = parts > 1
                             ? gpu::Shape{static_cast<std::int64_t>(B) * config.T / parts, config.C}
                             : gpu::Shape{B, config.T, config.C};
  const std::int64_t n = gpu::shape_numel(btc);
  // Chunks that receive nothing (first, last) need no boundary buffers.
  const bool needs_input = !spec.embedding, needs_dout = !spec.head;
  // (In the compute dtype: what travels between stages is bf16 with --bf16.)
  boundary_ = gpu::Tensor::empty(device, gpt_.dtype(), {2 * slots * n});
  for (int k = 0; k < slots; k++) {
    input_.push_back(needs_input ? boundary_.view(2 * k * n, btc) : gpu::Tensor{});
    output_grad_.push_back(needs_dout ? boundary_.view((2 * k + 1) * n, btc) : gpu::Tensor{});
  }
}

const gpu::Tensor& GptStage::input(int slot) const {
  return input_[static_cast<std::size_t>(slot)];
}
const gpu::Tensor& GptStage::output_grad(int slot) const {
  return output_grad_[static_cast<std::size_t>(slot)];
}

void GptStage::forward(gpu::Stream& s, int slot, const gpu::Tensor& tokens,
                       const gpu::Tensor& targets) {
  gpt_.forward(s, tokens, targets, input(slot), slot);
}

void GptStage::backward(gpu::Stream& s, int slot, const gpu::Tensor& tokens,
                        const gpu::Tensor& targets, float dloss,
                        const model::GradProgress& progress, bool finishes_step) {
  gpt_.backward(s, tokens, targets, dloss, output_grad(slot), slot, progress, finishes_step);
}

void GptStage::backward_input(gpu::Stream& s, int slot, int stash, const gpu::Tensor& tokens,
                              const gpu::Tensor& targets, float dloss, bool finishes_step) {
  gpt_.backward_input(s, tokens, targets, dloss, output_grad(slot), slot, stash, finishes_step);
}

void GptStage::backward_weight(gpu::Stream& s, int stash, int first, int count,
                               const model::GradProgress& progress) {
  gpt_.backward_weight(s, stash, progress, first, count);
}

}  // namespace troupe::actors
