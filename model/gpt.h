// GPT-2 on gpu/ ops: parameters, gradients and activations each in one
// allocation carved into named views, and a forward and backward that read
// like the architecture (pre-LN blocks, fused qkv, 4C MLP, final LN, LM head
// tied to the token embedding). No dropout: troupe trains as MT-NLG did,
// without it.
//
//   model::Gpt gpt(config, /*B=*/8, gpu::cpu_device());
//   if (absl::Status st = gpt.init(seed); !st.ok()) return st;
//   gpt.zero_grad(stream);
//   gpt.forward(stream, tokens, targets);          // tokens, targets: i32[B,T]
//   gpt.backward(stream, tokens, targets, 1.0f / (m * B * T));
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
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

// One layer's activations for one micro-batch. With tensor parallelism the
// dimensions marked `l` are this rank's part: 3Cl = 3C/tp (its heads' q, k,
// v), Cl = C/tp, NHl = NH/tp, 4Cl = 4C/tp. The LayerNorm and residual
// region's tensors, marked [rows], are (B, T, C) and (B, T), or with
// sequence parallelism this rank's rows of them, (B*T/tp, C) and (B*T/tp).
struct LayerActivations {
  gpu::Tensor ln1, ln1_mean, ln1_rstd;  // [rows]
  gpu::Tensor qkv;                      // (B, T, 3Cl)
  gpu::Tensor att;                      // (B, NHl, T, T) softmax probabilities (reference)
  gpu::Tensor lse;                      // (B, NHl, T) f32 log-sum-exp (flash)
  gpu::Tensor atty;                     // (B, T, Cl)
  gpu::Tensor residual2;                // [rows]
  gpu::Tensor ln2, ln2_mean, ln2_rstd;  // [rows]
  gpu::Tensor fch, fch_gelu;            // (B, T, 4Cl)
  gpu::Tensor residual3;                // [rows]: the layer's output
};

// What the forward keeps for the backward (per micro-batch slot). `layers` holds, per layer of the
// stage, what the recompute mode keeps (model::ActivationOptions): everything; all but att
// (selective with the reference attention; with flash, everything); or only residual3 where it is a
// recompute group's output (full). The head's tensors are empty on stages without the head; Vl =
// Vp/tp.
struct GptActivations {
  gpu::Tensor encoded;  // [rows]
  std::vector<LayerActivations> layers;
  gpu::Tensor lnf, lnf_mean, lnf_rstd;  // [rows]
  gpu::Tensor logits;                   // (B, T, Vl); the backward turns it into dlogits
  gpu::Tensor lse, losses;              // (B, T)
  gpu::Tensor ce_stats, ce_gathered;    // (B*T, 3), (tp, B*T, 3): vocab-parallel softmax
  gpu::Tensor dresidual;  // [rows]: the backward's running gradient, at the end the input's
};

// Scratch of the forward and backward, shared by the slots (one chunk's ops
// run in order on its stream).
struct GptScratch {
  gpu::Tensor btc;    // (B, T, C): the projections' outputs
  gpu::Tensor dbtc;   // (B, T, C)
  gpu::Tensor datty;  // (B, T, Cl)
  gpu::Tensor dqkv;   // (B, T, 3Cl)
  gpu::Tensor datt;   // (B, NHl, T, T) (reference attention)
  gpu::Tensor delta;  // (B, NHl, T) f32 (flash attention)
  gpu::Tensor dfch;   // (B, T, 4Cl)
  // Sequence parallelism only: a region's rows all-gathered (B, T, C), a
  // reduce-scatter's rows (B*T/tp, C), and this rank's rows' parts of the
  // stage's LayerNorm gradients, f32, summed over the step's micro-batches
  // before their one sum over the TP group (Gpt::layernorm_backward): per
  // layer (ln1w, ln1b, ln2w, ln2b), then the head's (lnfw, lnfb). Unlike
  // the rest, ln_parts keeps its values from one backward to the next.
  gpu::Tensor gathered, rows, ln_parts;
};

// Bytes of one activation slot of `stage` (every GptActivations tensor the
// recompute mode keeps, in the compute dtype of activations.precision or
// f32 for statistics, each rounded up to 64 bytes as Gpt carves them) for
// micro-batches of B and a TP slice of tp: what Gpt allocates per slot.
// The planner's counted memory (actors/rank/memory_plan.h) uses it.
std::int64_t counted_slot_bytes(const GptConfig& config, const StageSpec& stage, std::int64_t B,
                                int tp, const ActivationOptions& activations = {});
// Bytes of the recompute workspace, shared by every slot: what the
// backward rebuilds one group (full) or one layer's scores (selective) in.
// And of the GptScratch, shared too.
std::int64_t counted_workspace_bytes(const GptConfig& config, const StageSpec& stage,
                                     std::int64_t B, int tp, const ActivationOptions& activations);
std::int64_t counted_scratch_bytes(const GptConfig& config, const StageSpec& stage, std::int64_t B,
                                   int tp, const ActivationOptions& activations = {});
// Bytes of one weight stash (Gpt::backward_input): the operands of the
// layers' weight-gradient GEMMs (each linear layer's input and output
// gradient), kept from a micro-batch's B until its W.
std::int64_t counted_stash_bytes(const GptConfig& config, const StageSpec& stage, std::int64_t B,
                                 int tp, const ActivationOptions& activations = {});

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
  // out = this peer's 1/tp part (by peer order) of the sum of `in` over the
  // peers (sequence parallelism).
  std::function<void(gpu::Stream&, const gpu::Tensor& in, const gpu::Tensor& out)> reduce_scatter;
};

class Gpt {
 public:
  // Allocates parameters, gradients and activations of `stage` (default: the
  // whole model) for micro-batches of B sequences of config.T tokens on
  // `device`. The config must be valid.
  // `slots` sets of activations let that many micro-batches be between
  // their forward and their backward at once (a 1F1B stage keeps up to
  // pp - s); each call names the slot of its micro-batch. `stashes` weight
  // stashes let that many be between backward_input and backward_weight.
  Gpt(const GptConfig& config, int B, gpu::Device& device);
  Gpt(const GptConfig& config, int B, gpu::Device& device, const StageSpec& stage, int slots = 1,
      TensorParallel tp = {}, const ActivationOptions& activations = {}, int stashes = 0);

  const GptConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  int B() const { return B_; }
  // The compute dtype (activations.precision's): of the activations, their
  // gradients, the parameters' compute copy and what travels between stages.
  gpu::DType dtype() const { return gpu::compute_dtype(act_.precision); }
  // The parameters' compute copy (dtype()) and their fp32 main gradients.
  const gpu::Tensor& params() const { return params_flat_; }
  const gpu::Tensor& grads() const { return grads_flat_; }
  const GptActivations& acts(int slot = 0) const { return slots_[static_cast<std::size_t>(slot)]; }
  int slots() const { return static_cast<int>(slots_.size()); }
  const ActivationOptions& activation_options() const { return act_; }
  // Device bytes the activations took, measured when they were allocated:
  // one slot's (a micro-batch between its forward and its backward) and
  // the recompute workspace (shared by the slots).
  std::int64_t activation_bytes_per_slot() const { return slot_bytes_; }
  std::int64_t recompute_workspace_bytes() const { return workspace_bytes_; }
  std::int64_t scratch_bytes() const { return scratch_bytes_; }
  int stashes() const { return static_cast<int>(stashes_.size()); }
  std::int64_t stash_bytes() const { return stash_bytes_; }  // of one

  // Counter-based GPT-2 initialisation (model/init.h); synchronous. An
  // error when the copy to the device fails.
  absl::Status init(std::uint64_t seed);

  // The parameters from (to) fp32 host values in layout order, converted
  // to (from) the compute dtype; synchronous.
  absl::Status copy_params_from_host(std::span<const float> values);
  absl::Status copy_params_to_host(std::span<float> values) const;

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
  // With sequence parallelism each TP rank's rows give a part of the
  // LayerNorm gradients; the parts are summed over the micro-batches and
  // then, in the backward that `finishes_step` (the step's last), once over
  // the TP group, as Megatron's finalize_model_grads does. (Always true:
  // each backward sums its own.)
  void backward(gpu::Stream& s, const gpu::Tensor& tokens, const gpu::Tensor& targets, float dloss,
                const gpu::Tensor& dout = gpu::Tensor{}, int slot = 0,
                const GradProgress& progress = {}, bool finishes_step = true);
  // The backward in its two halves, as zero-bubble pipelines run it (Qi et
  // al., ICLR 2024). backward_input (B) is backward() without the weight
  // gradients of the layers' linear layers (qkv, attention projection, fc,
  // fc projection): it makes input_grad(slot), the LayerNorm, bias, LM-head
  // and embedding gradients, and copies the operands of the rest into weight
  // stash `stash`, so the slot is free when it is done (the LM head's stays
  // in B: deferring it would keep the (B, T, V) logits' gradient per stash). backward_weight (W)
  // adds those gradients from the stash alone (no collective, so tensor-parallel peers may run it
  // at different times) and calls `progress` as backward() does. B, then W (other micro-batches'
  // ops between them or not), adds bitwise what backward() adds: each parameter's gradient gets the
  // same sums in the same order.
  // The TP group's sum of the LayerNorm gradients is B's (finishes_step as
  // backward()'s).
  void backward_input(gpu::Stream& s, const gpu::Tensor& tokens, const gpu::Tensor& targets,
                      float dloss, const gpu::Tensor& dout, int slot, int stash,
                      bool finishes_step = true);
  // W in pieces, one a layer of the stage (one, if it has none): pieces
  // [first, first + count) (count -1: the rest), in order.
  void backward_weight(gpu::Stream& s, int stash, const GradProgress& progress = {}, int first = 0,
                       int count = -1);
  int weight_pieces() const { return std::max(1, stage_.layers()); }

  const StageSpec& stage() const { return stage_; }
  const TpSlice& tp() const { return tp_.slice; }
  // (B, T, C): what a stage without the head hands to the next stage, and
  // (after the backward) the gradient a stage without the embedding hands back.
  gpu::Tensor output(int slot = 0) const;
  const gpu::Tensor& input_grad(int slot = 0) const { return acts(slot).dresidual; }

 private:
  // Where layer l's activations are in the forward (kForward), in the
  // backward's recompute of its group (kRecompute), in its backward.
  enum class Pass { kForward, kRecompute, kBackward };
  LayerActivations layer_acts(const GptActivations& a, int l, Pass pass) const;
  // Layer l's input: the slot's `in` for layer 0, else the output of layer
  // l - 1 where it is kept (or, inside a recompute group, rebuilt).
  gpu::Tensor layer_input(const GptActivations& a, const gpu::Tensor& in, int l) const;
  void layer_forward(gpu::Stream& s, const LayerActivations& x, const gpu::Tensor& residual, int l);
  void layer_backward(gpu::Stream& s, GptActivations& a, const LayerActivations& x,
                      const gpu::Tensor& residual, int l);

  // Sums a partial result over the TP peers (nothing when tp = 1).
  void all_reduce(gpu::Stream& s, const gpu::Tensor& x);
  bool sequence_parallel() const { return act_.sequence_parallel && tp_.slice.tp > 1; }
  // The region's full (B, T, C) from its [rows] x: x itself, or with
  // sequence parallelism x's rows all-gathered into the scratch (Megatron's
  // g). Valid until the next gathered().
  gpu::Tensor gathered(gpu::Stream& s, const gpu::Tensor& x);
  // The [rows] of the sum over the TP peers of a partial (B, T, C): the
  // all-reduced x itself, or its reduce-scattered rows in the scratch
  // (Megatron's g-bar).
  gpu::Tensor reduced(gpu::Stream& s, const gpu::Tensor& partial);
  // A LayerNorm's backward into dw, db; with sequence parallelism this
  // rank's rows' part goes into scratch_.ln_parts rows part, part + 1
  // instead (sum_ln_parts adds it).
  void layernorm_backward(gpu::Stream& s, const gpu::Tensor& dinp, const gpu::Tensor& dw,
                          const gpu::Tensor& db, int part, const gpu::Tensor& dout,
                          const gpu::Tensor& inp, const gpu::Tensor& w, const gpu::Tensor& mean,
                          const gpu::Tensor& rstd);
  // Sequence parallelism, in the backward that finishes the step: the parts
  // in ln_parts rows [part, part + grads.size()), summed over the TP group,
  // added to grads (in row order), and zeroed for the next step.
  void sum_ln_parts(gpu::Stream& s, int part, std::initializer_list<gpu::Tensor> grads);
  gpu::VocabSlice vocab_slice() const;

  // The backward; with defer_ set (backward_input), the weight gradients
  // go into *defer_ instead of being added now.
  void backward_pass(gpu::Stream& s, const gpu::Tensor& tokens, const gpu::Tensor& targets,
                     float dloss, const gpu::Tensor& dout, int slot, const GradProgress& progress);
  // dw += dout^T . inp, now or (B) from copies in the stash.
  void weight_grad(gpu::Stream& s, const gpu::Tensor& dw, const gpu::Tensor& dout,
                   const gpu::Tensor& inp);
  // Tells `progress` that point p's gradients are final, now or after W's jobs so far.
  void point(const GradProgress& progress, GradPoint p);
  // A copy of t in the stash being filled (stream order).
  gpu::Tensor stashed(gpu::Stream& s, const gpu::Tensor& t);
  struct WeightJob {
    enum class Kind { kMatmul, kPoint };
    Kind kind = Kind::kMatmul;
    gpu::Tensor dw, dout, inp;
    GradPoint point;
  };
  struct WeightStash {
    gpu::Tensor flat;
    std::int64_t used = 0;  // bytes
    std::vector<WeightJob> jobs;
  };

  GptConfig config_;
  StageSpec stage_;
  TensorParallel tp_;
  int B_;
  gpu::Device& device_;
  ParamLayout layout_;
  gpu::Tensor params_flat_, grads_flat_;
  GptParams p_, g_;
  ActivationOptions act_;
  std::vector<GptActivations> slots_;
  // The recompute workspace: full, one LayerActivations per position in a
  // group; selective, [0].att and [0].atty only.
  std::vector<LayerActivations> work_;
  GptScratch scratch_;
  std::int64_t slot_bytes_ = 0, workspace_bytes_ = 0, scratch_bytes_ = 0, stash_bytes_ = 0;
  std::vector<WeightStash> stashes_;
  WeightStash* defer_ = nullptr;     // during backward_input
  bool finishes_step_ = true;        // during a backward
  std::vector<gpu::Tensor> inputs_;  // per slot: its encoded, or the previous stage's output
  gpu::Tensor zero_wpe_;             // (T, C) zeros: TP ranks t > 0 add wpe through rank 0
};

}  // namespace troupe::model
