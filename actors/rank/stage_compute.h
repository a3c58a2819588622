// What a shard actor computes for one model chunk, behind a small interface:
// the GPT chunk (GptStage) in training, ops of fixed cost in the pipeline
// benchmark. The actor owns the order (its schedule); this owns the math.
//
// Slots: a micro-batch holds a slot from its forward until its backward is
// done; each slot has its own activations, input and output-gradient buffer.
//
//   actors::GptStage stage(config, B, spec, /*slots=*/3, gpu::cpu_device());
//   stage.forward(stream, slot, tokens, targets);        // input: stage.input(slot)
//   stage.backward(stream, slot, tokens, targets, dloss, [](model::GradPoint p) { ... },
//                  /*finishes_step=*/true);
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/device.h"
#include "gpu/tensor.h"
#include "model/gpt.h"

namespace troupe::actors {

class StageCompute {
 public:
  virtual ~StageCompute() = default;

  virtual const model::StageSpec& spec() const = 0;
  virtual const model::ParamLayout& layout() const = 0;
  virtual int slots() const = 0;
  // Flat parameter and gradient buffers (layout().total() elements each):
  // the parameters' compute copy (f32, bf16 or f16) and the fp32 main
  // gradients.
  virtual const gpu::Tensor& params() const = 0;
  virtual const gpu::Tensor& grads() const = 0;

  // Where the previous stage's activation (B, T, C) is received for `slot`,
  // and where the next stage's gradient of our output is received.
  virtual const gpu::Tensor& input(int slot) const = 0;
  virtual const gpu::Tensor& output_grad(int slot) const = 0;
  // After the forward: what goes to the next stage; on the head chunk, the
  // per-token losses (B, T).
  virtual gpu::Tensor output(int slot) const = 0;
  virtual const gpu::Tensor& losses(int slot) const = 0;
  // After the backward: the gradient of our input, for the previous stage.
  virtual const gpu::Tensor& input_grad(int slot) const = 0;

  // Device bytes of one slot's activations (what a micro-batch keeps
  // between its forward and backward) and of the recompute workspace the
  // slots share, as allocated; 0 where the chunk keeps none.
  virtual std::int64_t activation_bytes_per_slot() const { return 0; }
  virtual std::int64_t recompute_workspace_bytes() const { return 0; }

  virtual void zero_grad(gpu::Stream& s) = 0;
  // tokens and targets: i32 (B, T) of this micro-batch (used on the chunks
  // with the embedding and the head).
  virtual void forward(gpu::Stream& s, int slot, const gpu::Tensor& tokens,
                       const gpu::Tensor& targets) = 0;
  // Adds this micro-batch's gradients (each token's loss weighted by dloss);
  // calls `progress` as groups of gradients become final. `finishes_step`:
  // the step's last backward of the chunk, which sums what the TP peers
  // keep apart until then (model::Gpt::backward).
  virtual void backward(gpu::Stream& s, int slot, const gpu::Tensor& tokens,
                        const gpu::Tensor& targets, float dloss,
                        const model::GradProgress& progress, bool finishes_step) = 0;
  // The backward in two halves (the zero-bubble schedules; model::Gpt::
  // backward_input and backward_weight): B frees the slot and fills weight
  // stash `stash`; W runs pieces [first, first + count) of weight_pieces()
  // (one a layer) from it, calling `progress` as backward() does. B, then
  // every piece of W in order, adds bitwise what backward() adds.
  virtual int stashes() const { return 0; }
  virtual std::int64_t stash_bytes() const { return 0; }
  virtual int weight_pieces() const { return 1; }
  virtual void backward_input(gpu::Stream& s, int slot, int stash, const gpu::Tensor& tokens,
                              const gpu::Tensor& targets, float dloss, bool finishes_step) = 0;
  virtual void backward_weight(gpu::Stream& s, int stash, int first, int count,
                               const model::GradProgress& progress) = 0;
};

// A GPT model chunk (model::Gpt with a StageSpec) and its slot buffers.
class GptStage : public StageCompute {
 public:
  GptStage(const model::GptConfig& config, int B, const model::StageSpec& spec, int slots,
           gpu::Device& device, model::TensorParallel tp = {},
           const model::ActivationOptions& activations = {}, int stashes = 0);

  model::Gpt& gpt() { return gpt_; }
  const model::StageSpec& spec() const override { return gpt_.stage(); }
  const model::ParamLayout& layout() const override { return gpt_.layout(); }
  int slots() const override { return gpt_.slots(); }
  const gpu::Tensor& params() const override { return gpt_.params(); }
  const gpu::Tensor& grads() const override { return gpt_.grads(); }
  const gpu::Tensor& input(int slot) const override;
  const gpu::Tensor& output_grad(int slot) const override;
  gpu::Tensor output(int slot) const override { return gpt_.output(slot); }
  const gpu::Tensor& losses(int slot) const override { return gpt_.acts(slot).losses; }
  const gpu::Tensor& input_grad(int slot) const override { return gpt_.input_grad(slot); }

  std::int64_t activation_bytes_per_slot() const override {
    return gpt_.activation_bytes_per_slot();
  }
  std::int64_t recompute_workspace_bytes() const override {
    return gpt_.recompute_workspace_bytes();
  }

  void zero_grad(gpu::Stream& s) override { gpt_.zero_grad(s); }
  void forward(gpu::Stream& s, int slot, const gpu::Tensor& tokens,
               const gpu::Tensor& targets) override;
  void backward(gpu::Stream& s, int slot, const gpu::Tensor& tokens, const gpu::Tensor& targets,
                float dloss, const model::GradProgress& progress, bool finishes_step) override;
  int stashes() const override { return gpt_.stashes(); }
  std::int64_t stash_bytes() const override { return gpt_.stash_bytes(); }
  int weight_pieces() const override { return gpt_.weight_pieces(); }
  void backward_input(gpu::Stream& s, int slot, int stash, const gpu::Tensor& tokens,
                      const gpu::Tensor& targets, float dloss, bool finishes_step) override;
  void backward_weight(gpu::Stream& s, int stash, int first, int count,
                       const model::GradProgress& progress) override;

 private:
  model::Gpt gpt_;
  gpu::Tensor boundary_;  // (2 * slots, B, T, C): input and output gradient of each slot
  std::vector<gpu::Tensor> input_, output_grad_;
};

}  // namespace troupe::actors
