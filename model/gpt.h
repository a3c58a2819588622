// GPT-2 on gpu/ ops: parameters, gradients and activations each in one
// allocation carved into named views, and a forward and backward that read
// like the architecture (pre-LN blocks, fused qkv, 4C MLP, final LN, LM head
// tied to the token embedding). No dropout: troupe trains as MT-NLG did,
// without it.
//
//   model::Gpt gpt(config, /*B=*/8, gpu::cpu_device());
//   gpt.init(seed);
//   gpt.zero_grad(stream);
//   gpt.forward(stream, tokens, targets);          // tokens, targets: i32[B,T]
//   gpt.backward(stream, tokens, targets, 1.0f / (m * B * T));
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/tensor.h"
#include "model/config.h"
#include "model/layout.h"

namespace troupe::model {

// One layer's parameters (or gradients): views into the flat buffer.
struct LayerParams {
  gpu::Tensor ln1w, ln1b;          // (C)
  gpu::Tensor qkvw, qkvb;          // (3C, C), (3C)
  gpu::Tensor attprojw, attprojb;  // (C, C), (C)
  gpu::Tensor ln2w, ln2b;          // (C)
  gpu::Tensor fcw, fcb;            // (4C, C), (4C)
  gpu::Tensor fcprojw, fcprojb;    // (C, 4C), (C)
};

struct GptParams {
  gpu::Tensor wte;  // (Vp, C), tied LM head; rows V..Vp-1 are zero
  gpu::Tensor wpe;  // (T, C)
  std::vector<LayerParams> h;
  gpu::Tensor lnfw, lnfb;  // (C)
  // Views of the parameters a stage holds (absent ones stay undefined).
  static GptParams carve(const ParamLayout& layout, const gpu::Tensor& flat,
                         const StageSpec& stage);
};

// What the forward keeps for the backward, per layer of the stage where it
// says (L, ...); the head's tensors are empty on stages without the head.
// With tensor parallelism, the dimensions marked `l` are this rank's part:
// 3Cl = 3C/tp (its heads' q, k, v), Cl = C/tp, NHl = NH/tp, 4Cl = 4C/tp,
// Vl = Vp/tp.
struct GptActivations {
  gpu::Tensor encoded;                  // (B, T, C)
  gpu::Tensor ln1, ln1_mean, ln1_rstd;  // (L, B, T, C), (L, B, T) x2
  gpu::Tensor qkv;                      // (L, B, T, 3Cl)
  gpu::Tensor att;                      // (L, B, NHl, T, T) softmax probabilities
  gpu::Tensor atty;                     // (L, B, T, Cl)
  gpu::Tensor residual2;                // (L, B, T, C)
  gpu::Tensor ln2, ln2_mean, ln2_rstd;  // (L, B, T, C), (L, B, T) x2
  gpu::Tensor fch, fch_gelu;            // (L, B, T, 4Cl)
  gpu::Tensor residual3;                // (L, B, T, C)
  gpu::Tensor lnf, lnf_mean, lnf_rstd;  // (B, T, C), (B, T) x2
  gpu::Tensor logits;                   // (B, T, Vl); the backward turns it into dlogits
  gpu::Tensor lse, losses;              // (B, T)
  gpu::Tensor ce_stats, ce_gathered;    // (B*T, 3), (tp, B*T, 3): vocab-parallel softmax
  // Backward scratch.
  gpu::Tensor scratch_btc;      // (B, T, C)
  gpu::Tensor dresidual, dbtc;  // (B, T, C)
  gpu::Tensor datty;            // (B, T, Cl)
  gpu::Tensor dqkv;             // (B, T, 3Cl)
  gpu::Tensor datt;             // (B, NHl, T, T)
  gpu::Tensor dfch;             // (B, T, 4Cl)
};

// Floats of one activation slot of `stage` (every GptActivations tensor,
// each rounded up to 16 floats as Gpt carves them) for micro-batches of B
// and a TP slice of tp: what Gpt allocates per slot. The planner's counted
// memory (actors/memory_plan.h) uses it.
std::int64_t activation_floats_per_slot(const GptConfig& config, const StageSpec& stage,
                                        std::int64_t B, int tp);

// Points of the backward after which a group of gradients is final for this
// micro-batch: the head (ln_f and, tied, the LM head's share of wte), each
// layer (global index, last layer first), then the embedding (wte, wpe).
struct GradPoint {
  enum class Part { kHead, kLayer, kEmbedding };
  Part part = Part::kHead;
  int layer = -1;  // kLayer: the global layer index
  bool operator==(const GradPoint&) const = default;
};
// Called by backward() right after enqueuing the ops that finish a point,
// so a caller can enqueue a notification behind them (gradient buckets).
using GradProgress = std::function<void(GradPoint)>;

// A tensor-parallel shard's link to its peers (Megatron's tensor slicing):
// each call is enqueued on the stream and takes effect in stream order;
// every peer makes the same calls in the same order. Unused when tp = 1.
struct TensorParallel {
  TpSlice slice;
  // x = the sum of x over the peers (bitwise the same on every peer).
  std::function<void(gpu::Stream&, const gpu::Tensor& x)> all_reduce;
  // out (tp, ...) = every peer's `in`, in peer order.
  std::function<void(gpu::Stream&, const gpu::Tensor& in, const gpu::Tensor& out)> all_gather;
};

class Gpt {
 public:
  // Allocates parameters, gradients and activations of `stage` (default: the
  // whole model) for micro-batches of B sequences of config.T tokens on
  // `device`. The config must be valid.
  // `slots` sets of activations let that many micro-batches be between
  // their forward and their backward at once (a 1F1B stage keeps up to
  // pp - s); each call names the slot of its micro-batch.
  Gpt(const GptConfig& config, int B, gpu::Device& device);
  Gpt(const GptConfig& config, int B, gpu::Device& device, const StageSpec& stage, int slots = 1,
      TensorParallel tp = {});

  const GptConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  int B() const { return B_; }
  const gpu::Tensor& params() const { return params_flat_; }
  const gpu::Tensor& grads() const { return grads_flat_; }
  const GptActivations& acts(int slot = 0) const { return slots_[static_cast<std::size_t>(slot)]; }
  int slots() const { return static_cast<int>(slots_.size()); }

  // Counter-based GPT-2 initialisation (model/init.h); synchronous.
  void init(std::uint64_t seed);

  void zero_grad(gpu::Stream& s);
  // tokens, targets: i32 (B, T). Without targets only the logits are made.
  // A stage without the embedding reads `input` (B, T, C), the previous
  // stage's output(), instead of tokens; it must stay unchanged until the
  // backward.
  void forward(gpu::Stream& s, const gpu::Tensor& tokens, const gpu::Tensor& targets,
               const gpu::Tensor& input = gpu::Tensor{}, int slot = 0);
  // Adds this micro-batch's gradients, each token's loss weighted by `dloss`
  // (1 / tokens in the global batch for a mean). Needs the forward before it.
  // The logits are overwritten by their gradient. A stage without the head
  // starts from `dout` (B, T, C), the next stage's input_grad().
  void backward(gpu::Stream& s, const gpu::Tensor& tokens, const gpu::Tensor& targets, float dloss,
                const gpu::Tensor& dout = gpu::Tensor{}, int slot = 0,
                const GradProgress& progress = {});

  const StageSpec& stage() const { return stage_; }
  const TpSlice& tp() const { return tp_.slice; }
  // (B, T, C): what a stage without the head hands to the next stage, and
  // (after the backward) the gradient a stage without the embedding hands back.
  gpu::Tensor output(int slot = 0) const;
  const gpu::Tensor& input_grad(int slot = 0) const { return acts(slot).dresidual; }

 private:
  void layer_forward(gpu::Stream& s, GptActivations& a, int l, const gpu::Tensor& residual);
  void layer_backward(gpu::Stream& s, GptActivations& a, int l, const gpu::Tensor& residual);

  // Sums a partial result over the TP peers (nothing when tp = 1).
  void all_reduce(gpu::Stream& s, const gpu::Tensor& x);
  gpu::VocabSlice vocab_slice() const;

  GptConfig config_;
  StageSpec stage_;
  TensorParallel tp_;
  int B_;
  gpu::Device& device_;
  ParamLayout layout_;
  gpu::Tensor params_flat_, grads_flat_;
  GptParams p_, g_;
  std::vector<GptActivations> slots_;
  std::vector<gpu::Tensor> inputs_;  // per slot: its encoded, or the previous stage's output
  gpu::Tensor zero_wpe_;             // (T, C) zeros: TP ranks t > 0 add wpe through rank 0
};

}  // namespace troupe::model
