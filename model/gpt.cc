// GPT-2 forward and backward, one named op per step, as in the paper.
#include "model/gpt.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/host_values.h"
#include "gpu/ops.h"
#include "model/gpt_buffers.h"
#include "model/init.h"

namespace troupe::model {

using gpu::Accumulate;
using gpu::Tensor;
namespace ops = gpu::ops;

using buffers::Carver;
using buffers::layer_keep;
using buffers::LayerKeep;

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device)
    : Gpt(config, B, device, StageSpec::whole(config)) {}

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device, const StageSpec& stage, int slots,
         TensorParallel tp, const ActivationOptions& activations, int stashes)
    : config_(config),
      stage_(stage),
      tp_(std::move(tp)),
      B_(B),
      device_(device),
      layout_(ParamLayout::gpt(config, stage, tp_.slice)),
      act_(activations) {
  act_.attention = resolve_attention_kernel(act_.attention, device.kind());
  const int P = tp_.slice.tp;
  const gpu::DType A = dtype();
  // The compute copy of the parameters in the compute dtype; their
  // gradients are the fp32 main gradients.
  params_flat_ = Tensor::empty(device, A, {layout_.total()});
  grads_flat_ = Tensor::empty(device, gpu::DType::kF32, {layout_.total()});
  p_ = GptParams::carve(layout_, params_flat_, stage);
  g_ = GptParams::carve(layout_, grads_flat_, stage);
  const std::int64_t per_slot = counted_slot_bytes(config, stage, B, P, act_);
  std::int64_t before = device.allocated_bytes();
  Tensor flat = buffers::allocate_bytes(device, per_slot * slots);
  slot_bytes_ = slots > 0 ? (device.allocated_bytes() - before) / slots : 0;
  for (int k = 0; k < slots; k++) {
    std::int64_t used = per_slot * k;
    Carver carver(&used, A);
    carver.bind(flat);
    slots_.push_back(buffers::carve_activations(config, stage, B, P, act_, carver));
  }
  if (const std::int64_t n = counted_workspace_bytes(config, stage, B, P, act_); n > 0) {
    before = device.allocated_bytes();
    Tensor work = buffers::allocate_bytes(device, n);
    workspace_bytes_ = device.allocated_bytes() - before;
    std::int64_t used = 0;
    Carver carver(&used, A);
    carver.bind(work);
    work_ = buffers::carve_workspace(config, stage, B, P, act_, carver);
  }
  {
    before = device.allocated_bytes();
    Tensor scratch =
        buffers::allocate_bytes(device, counted_scratch_bytes(config, stage, B, P, act_));
    scratch_bytes_ = device.allocated_bytes() - before;
    std::int64_t used = 0;
    Carver carver(&used, A);
    carver.bind(scratch);
    scratch_ = buffers::carve_scratch(config, stage, B, P, act_, carver);
    if (scratch_.ln_parts.defined() && scratch_.ln_parts.numel() > 0) {
      const std::vector<float> zeros(static_cast<std::size_t>(scratch_.ln_parts.numel()), 0.0f);
      (void)device.copy_from_host(zeros.data(), scratch_.ln_parts);
    }
  }
  if (stashes > 0) {
    const std::int64_t n = counted_stash_bytes(config, stage, B, P, act_);
    before = device.allocated_bytes();
    Tensor flat = buffers::allocate_bytes(device, n * stashes);
    stash_bytes_ = (device.allocated_bytes() - before) / stashes;
    for (int k = 0; k < stashes; k++) {
      WeightStash w;
      w.flat = flat.view_as(gpu::DType::kF32, n * k, {n / 4});
      stashes_.push_back(std::move(w));
    }
  }
  inputs_.resize(static_cast<std::size_t>(slots));
  if (stage.embedding && tp_.slice.t > 0) {
    zero_wpe_ = Tensor::empty(device, A, {config.T, config.C});
    std::vector<char> zeros(zero_wpe_.nbytes(), 0);  // +0 in every dtype
    (void)device.copy_from_host(zeros.data(), zero_wpe_);
  }
}

void Gpt::all_reduce(gpu::Stream& s, const Tensor& x) {
  if (tp_.slice.tp > 1) tp_.all_reduce(s, x);
}

Tensor Gpt::gathered(gpu::Stream& s, const Tensor& x) {
  if (!sequence_parallel()) return x;
  tp_.all_gather(s, x, scratch_.gathered);
  return scratch_.gathered;
}

Tensor Gpt::reduced(gpu::Stream& s, const Tensor& partial) {
  if (tp_.slice.tp == 1) return partial;
  const Tensor& sum = sequence_parallel() ? scratch_.rows : partial;
  if (sequence_parallel()) {
    tp_.reduce_scatter(s, partial, sum);
  } else {
    all_reduce(s, partial);
  }
  return sum;
}

void Gpt::layernorm_backward(gpu::Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                             int part, const Tensor& dout, const Tensor& inp, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd) {
  if (!sequence_parallel()) {
    ops::layernorm_backward(s, dinp, dw, db, dout, inp, w, mean, rstd);
    return;
  }
  // This rank's rows' part of dw and db, added to the step's parts so far.
  const std::int64_t C = config_.C;
  ops::layernorm_backward(s, dinp, scratch_.ln_parts.view(part * C, {C}),
                          scratch_.ln_parts.view((part + 1) * C, {C}), dout, inp, w, mean, rstd);
}

void Gpt::sum_ln_parts(gpu::Stream& s, int part, std::initializer_list<Tensor> grads) {
  if (!sequence_parallel() || !finishes_step_) return;
  // Every peer adds the same sum.
  const std::int64_t C = config_.C;
  const auto n = static_cast<std::int64_t>(grads.size());
  const Tensor parts = scratch_.ln_parts.view(part * C, {n, C});
  all_reduce(s, parts);  // one collective for the layer's LayerNorms
  std::int64_t i = 0;
  for (const Tensor& g : grads) ops::axpy(s, g, 1.0f, parts.view(i++ * C, {C}));
  ops::fill(s, parts, 0.0f);
}

gpu::VocabSlice Gpt::vocab_slice() const {
  if (tp_.slice.tp == 1) return {};
  const std::int64_t rows = config_.Vp() / tp_.slice.tp;
  return {.begin = tp_.slice.t * rows, .total = config_.V};
}

Tensor Gpt::output(int slot) const { return acts(slot).layers.back().residual3; }

LayerActivations Gpt::layer_acts(const GptActivations& a, int l, Pass pass) const {
  const LayerKeep k = layer_keep(act_, stage_.layers(), l);
  const LayerActivations& kept = a.layers[static_cast<std::size_t>(l)];
  switch (k.mode) {
    case LayerKeep::Mode::kAll:
      return kept;
    case LayerKeep::Mode::kNoScores: {
      LayerActivations x = kept;
      x.att = work_[0].att;
      return x;
    }
    case LayerKeep::Mode::kRecomputed:
      break;
  }
  // A recompute writes the group's last output to the workspace: the kept
  // one (bitwise the same) may still be on its way to the next stage.
  LayerActivations x = work_[static_cast<std::size_t>(k.pos)];
  if (k.keeps_output && pass != Pass::kRecompute) x.residual3 = kept.residual3;
  return x;
}

Tensor Gpt::layer_input(const GptActivations& a, const Tensor& in, int l) const {
  const LayerKeep k = layer_keep(act_, stage_.layers(), l);
  if (k.mode == LayerKeep::Mode::kRecomputed && k.pos > 0) {
    return work_[static_cast<std::size_t>(k.pos - 1)].residual3;
  }
  return l == 0 ? in : a.layers[static_cast<std::size_t>(l - 1)].residual3;
}

absl::Status Gpt::init(std::uint64_t seed) {
  std::vector<float> host(static_cast<std::size_t>(layout_.total()), 0.0f);
  for (const ParamSpec& spec : layout_.specs()) {
    init_values(
        config_, spec, seed, 0,
        std::span<float>(host.data() + spec.offset, static_cast<std::size_t>(spec.numel())));
  }
  // Mixed precision computes with the values rounded to its dtype; the
  // optimizer's master starts from them (Megatron makes its fp32 copy of
  // the bf16 model the same way).
  absl::Status st = copy_params_from_host(host);
  if (!st.ok())
    return absl::Status(st.code(), absl::StrCat("initialising the weights: ", st.message()));
  return absl::OkStatus();
}

absl::Status Gpt::copy_params_from_host(std::span<const float> values) {
  return gpu::copy_values_to_device(values, params_flat_);
}

absl::Status Gpt::copy_params_to_host(std::span<float> values) const {
  return gpu::copy_values_to_host(params_flat_, values);
}

void Gpt::zero_grad(gpu::Stream& s) {
  ops::fill(s, grads_flat_, 0.0f);
  // (A step that failed part-way may have left parts behind.)
  if (sequence_parallel() && scratch_.ln_parts.numel() > 0) ops::fill(s, scratch_.ln_parts, 0.0f);
}

void Gpt::forward(gpu::Stream& s, const Tensor& tokens, const Tensor& targets, const Tensor& input,
                  int slot) {
  GptActivations& a = slots_[static_cast<std::size_t>(slot)];
  Tensor& in = inputs_[static_cast<std::size_t>(slot)];
  const int L = stage_.layers();
  if (stage_.embedding) {
    // Vocab-parallel: each rank looks up its rows (others' tokens give 0),
    // rank 0 adds the position embedding, the all-reduce completes the sum.
    // (Sequence parallel: the sum's rows, by a reduce-scatter.)
    const Tensor& wpe = tp_.slice.t > 0 ? zero_wpe_ : p_.wpe;
    if (sequence_parallel()) {
      ops::embedding_forward(s, scratch_.btc, tokens, p_.wte, wpe, vocab_slice());
      tp_.reduce_scatter(s, scratch_.btc, a.encoded);
    } else {
      ops::embedding_forward(s, a.encoded, tokens, p_.wte, wpe, vocab_slice());
      all_reduce(s, a.encoded);
    }
    in = a.encoded;
  } else {
    in = input;
  }
  for (int l = 0; l < L; l++) {
    layer_forward(s, layer_acts(a, l, Pass::kForward), layer_input(a, in, l), l);
  }
  if (!stage_.head) return;
  ops::layernorm_forward(s, a.lnf, a.lnf_mean, a.lnf_rstd, output(slot), p_.lnfw, p_.lnfb);
  ops::matmul_forward(s, a.logits, gathered(s, a.lnf), p_.wte, Tensor{});
  if (!targets.defined()) return;
  const std::int64_t N = static_cast<std::int64_t>(B_) * config_.T;
  const Tensor logits = a.logits.reshape({N, a.logits.size(-1)});
  if (tp_.slice.tp == 1) {
    ops::crossentropy_forward(s, a.losses.reshape({N}), a.lse.reshape({N}), logits,
                              targets.reshape({N}), config_.V);
    return;
  }
  // Vocab-parallel cross-entropy: each rank's max, sum-exp and target logit
  // over its slice, gathered, then combined; the logits never are.
  ops::crossentropy_partial(s, a.ce_stats, logits, targets.reshape({N}), config_.V, vocab_slice());
  tp_.all_gather(s, a.ce_stats, a.ce_gathered);
  ops::crossentropy_combine(s, a.losses.reshape({N}), a.lse.reshape({N}), a.ce_gathered);
}

void Gpt::layer_forward(gpu::Stream& s, const LayerActivations& x, const Tensor& residual, int l) {
  const GptScratch& k = scratch_;
  const LayerParams& p = p_.h[static_cast<std::size_t>(l)];
  ops::layernorm_forward(s, x.ln1, x.ln1_mean, x.ln1_rstd, residual, p.ln1w, p.ln1b);
  ops::matmul_forward(s, x.qkv, gathered(s, x.ln1), p.qkvw, p.qkvb);
  if (act_.attention != AttentionKernel::kReference) {
    ops::flash_attention_forward(s, x.atty, x.lse, x.qkv);
  } else {
    ops::attention_forward(s, x.atty, x.att, x.qkv);
  }
  // Row-parallel projections: partial sums, completed by the all-reduce; the
  // bias is added once (by rank 0).
  const bool bias = tp_.slice.t == 0;
  ops::matmul_forward(s, k.btc, x.atty, p.attprojw, bias ? p.attprojb : Tensor{});
  ops::residual_layernorm_forward(s, x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual,
                                  reduced(s, k.btc), p.ln2w, p.ln2b);
  ops::matmul_gelu_forward(s, x.fch_gelu, x.fch, gathered(s, x.ln2), p.fcw, p.fcb);
  ops::matmul_forward(s, k.btc, x.fch_gelu, p.fcprojw, bias ? p.fcprojb : Tensor{});
  ops::residual_forward(s, x.residual3, x.residual2, reduced(s, k.btc));
}

void Gpt::backward(gpu::Stream& s, const Tensor& tokens, const Tensor& targets, float dloss,
                   const Tensor& dout, int slot, const GradProgress& progress, bool finishes_step) {
  finishes_step_ = finishes_step;
  backward_pass(s, tokens, targets, dloss, dout, slot, progress);
  finishes_step_ = true;
}

void Gpt::backward_input(gpu::Stream& s, const Tensor& tokens, const Tensor& targets, float dloss,
                         const Tensor& dout, int slot, int stash, bool finishes_step) {
  WeightStash& w = stashes_[static_cast<std::size_t>(stash)];
  w.used = 0;
  w.jobs.clear();
  defer_ = &w;
  finishes_step_ = finishes_step;
  backward_pass(s, tokens, targets, dloss, dout, slot, GradProgress{});
  finishes_step_ = true;
  defer_ = nullptr;
}

void Gpt::backward_weight(gpu::Stream& s, int stash, const GradProgress& progress, int first,
                          int count) {
  const WeightStash& w = stashes_[static_cast<std::size_t>(stash)];
  const int last = count < 0 ? weight_pieces() : first + count;
  int piece = 0;  // a layer's jobs and its point; the head's point goes with the first, the
                  // embedding's with the last
  for (const WeightJob& j : w.jobs) {
    const int at = std::min(piece, weight_pieces() - 1);
    if (j.kind == WeightJob::Kind::kPoint && j.point.part == GradPoint::Part::kLayer) piece++;
    if (at < first || at >= last) continue;
    switch (j.kind) {
      case WeightJob::Kind::kMatmul:
        ops::matmul_backward_weight(s, j.dw, j.dout, j.inp);
        break;
      case WeightJob::Kind::kPoint:
        if (progress) progress(j.point);
        break;
    }
  }
}

Tensor Gpt::stashed(gpu::Stream& s, const Tensor& t) {
  const std::int64_t bytes = (static_cast<std::int64_t>(t.nbytes()) + 63) / 64 * 64;
  if (defer_->used + bytes > static_cast<std::int64_t>(defer_->flat.nbytes())) {
    s.fail(absl::InternalError(absl::StrCat("backward_input: the weight stash's ",
                                            defer_->flat.nbytes(), " bytes are too few")));
    return Tensor{};
  }
  Tensor copy = defer_->flat.view_as(t.dtype, defer_->used, t.shape);
  defer_->used += bytes;
  ops::copy(s, copy, t);
  return copy;
}

void Gpt::weight_grad(gpu::Stream& s, const Tensor& dw, const Tensor& dout, const Tensor& inp) {
  if (defer_ == nullptr) {
    ops::matmul_backward_weight(s, dw, dout, inp);
    return;
  }
  const Tensor d = stashed(s, dout), x = stashed(s, inp);
  WeightJob& j = defer_->jobs.emplace_back();
  j.dw = dw;
  j.dout = d;
  j.inp = x;
}

void Gpt::point(const GradProgress& progress, GradPoint p) {
  if (defer_ != nullptr) {
    WeightJob& j = defer_->jobs.emplace_back();
    j.kind = WeightJob::Kind::kPoint;
    j.point = p;
  } else if (progress) {
    progress(p);
  }
}

void Gpt::backward_pass(gpu::Stream& s, const Tensor& tokens, const Tensor& targets, float dloss,
                        const Tensor& dout, int slot, const GradProgress& progress) {
  GptActivations& a = slots_[static_cast<std::size_t>(slot)];
  const Tensor& in = inputs_[static_cast<std::size_t>(slot)];
  const int L = stage_.layers();
  ops::fill(s, a.dresidual, 0.0f);
  if (stage_.head) {
    const std::int64_t N = static_cast<std::int64_t>(B_) * config_.T;
    Tensor logits = a.logits.reshape({N, a.logits.size(-1)});
    ops::crossentropy_backward(s, logits, logits, a.lse.reshape({N}), targets.reshape({N}), dloss,
                               config_.V, vocab_slice());
    // The LM head shares wte with the token embedding: both add into g_.wte.
    // (Its weight gradient stays in B: W would need a copy of the (B, T, V)
    // logits' gradient per pending micro-batch.)
    ops::matmul_backward(s, scratch_.dbtc, g_.wte, Tensor{}, a.logits, gathered(s, a.lnf), p_.wte,
                         Accumulate::kNo);
    // Each rank's vocabulary slice contributed a part.
    layernorm_backward(s, a.dresidual, g_.lnfw, g_.lnfb, 4 * L, reduced(s, scratch_.dbtc),
                       output(slot), p_.lnfw, a.lnf_mean, a.lnf_rstd);
    sum_ln_parts(s, 4 * L, {g_.lnfw, g_.lnfb});
    point(progress, {GradPoint::Part::kHead, -1});
  } else {
    ops::axpy(s, a.dresidual, 1.0f, dout);  // the next stage's gradient of our output
  }
  for (int l = L - 1; l >= 0; l--) {
    const LayerKeep k = layer_keep(act_, L, l);
    if (k.mode == LayerKeep::Mode::kRecomputed && k.keeps_output) {
      // The group's forward again, from its kept input, into the workspace.
      for (int r = k.group_first; r <= l; r++) {
        layer_forward(s, layer_acts(a, r, Pass::kRecompute), layer_input(a, in, r), r);
      }
    }
    layer_backward(s, a, layer_acts(a, l, Pass::kBackward), layer_input(a, in, l), l);
    point(progress, {GradPoint::Part::kLayer, stage_.first_layer + l});
  }
  if (stage_.embedding) {
    // (In B too: with the LM head's, on one stage, wte's gradient gets its
    // parts in the whole backward's order.)
    ops::embedding_backward(s, g_.wte, g_.wpe, gathered(s, a.dresidual), tokens, vocab_slice());
    point(progress, {GradPoint::Part::kEmbedding, -1});
  }
}

// On entry a.dresidual holds d(residual3[l]); on exit d(residual), the
// layer's input. The residual connections pass it through unchanged; each
// branch's LayerNorm backward adds its part. Every linear layer's weight
// gradient goes through weight_grad (now, or W's).
void Gpt::layer_backward(gpu::Stream& s, GptActivations& a, const LayerActivations& x,
                         const Tensor& residual, int l) {
  const LayerParams& p = p_.h[static_cast<std::size_t>(l)];
  const LayerParams& g = g_.h[static_cast<std::size_t>(l)];
  // (Sequence parallel: the gradient of the rows, all-gathered, is the
  // gradient of the reduce-scattered projection; the LayerNorm outputs are
  // gathered again for the weight gradients, as Megatron does.)
  // MLP branch.
  // (Mixed precision: activation gradients in the compute dtype, parameter
  // gradients added into the fp32 main gradients.)
  // (GELU's backward rides on fcproj's input-gradient GEMM, cuBLASLt's
  // DGELU epilogue on CUDA; fc's bias gradient is then dfch's fp32 column
  // sum.)
  const Tensor dmlp = gathered(s, a.dresidual);
  ops::matmul_backward_gelu(s, scratch_.dfch, g.fcb, Tensor{}, g.fcprojb, dmlp, x.fch_gelu,
                            p.fcprojw, x.fch);
  weight_grad(s, g.fcprojw, dmlp, x.fch_gelu);
  const Tensor ln2 = gathered(s, x.ln2);
  ops::matmul_backward(s, scratch_.dbtc, Tensor{}, Tensor{}, scratch_.dfch, ln2, p.fcw,
                       Accumulate::kNo);
  weight_grad(s, g.fcw, scratch_.dfch, ln2);
  // Column-parallel input: each rank's columns gave a part.
  layernorm_backward(s, a.dresidual, g.ln2w, g.ln2b, 4 * l + 2, reduced(s, scratch_.dbtc),
                     x.residual2, p.ln2w, x.ln2_mean, x.ln2_rstd);
  // Attention branch.
  const Tensor datt = gathered(s, a.dresidual);
  ops::matmul_backward(s, scratch_.datty, Tensor{}, g.attprojb, datt, x.atty, p.attprojw,
                       Accumulate::kNo);
  weight_grad(s, g.attprojw, datt, x.atty);
  // Selective recompute: the scores and softmax again, from the kept q, k,
  // v (the output, the same as the kept atty, goes to the workspace).
  if (act_.attention != AttentionKernel::kReference) {
    ops::flash_attention_backward(s, scratch_.dqkv, scratch_.delta, scratch_.datty, x.qkv, x.atty,
                                  x.lse);
  } else {
    if (act_.recomputes_scores()) ops::attention_forward(s, work_[0].atty, x.att, x.qkv);
    ops::attention_backward(s, scratch_.dqkv, scratch_.datt, scratch_.datty, x.qkv, x.att);
  }
  const Tensor ln1 = gathered(s, x.ln1);
  ops::matmul_backward(s, scratch_.dbtc, Tensor{}, g.qkvb, scratch_.dqkv, ln1, p.qkvw,
                       Accumulate::kNo);
  weight_grad(s, g.qkvw, scratch_.dqkv, ln1);
  layernorm_backward(s, a.dresidual, g.ln1w, g.ln1b, 4 * l, reduced(s, scratch_.dbtc), residual,
                     p.ln1w, x.ln1_mean, x.ln1_rstd);
  sum_ln_parts(s, 4 * l, {g.ln1w, g.ln1b, g.ln2w, g.ln2b});
}

}  // namespace troupe::model
