// GPT-2 forward and backward, one named op per step, as in the paper.
#include "model/gpt.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/host_values.h"
#include "gpu/ops.h"
#include "model/init.h"

namespace troupe::model {

using gpu::Accumulate;
using gpu::Tensor;
namespace ops = gpu::ops;

GptParams GptParams::carve(const ParamLayout& lay, const Tensor& flat, const StageSpec& stage) {
  GptParams p;
  if (stage.embedding || stage.head) p.wte = lay.view(flat, "wte.weight");
  if (stage.embedding) p.wpe = lay.view(flat, "wpe.weight");
  for (int l = stage.first_layer; l < stage.last_layer; l++) {
    const std::string h = absl::StrCat("h.", l, ".");
    auto v = [&](const char* n) { return lay.view(flat, h + n); };
    p.h.push_back({v("ln_1.weight"), v("ln_1.bias"), v("attn.c_attn.weight"), v("attn.c_attn.bias"),
                   v("attn.c_proj.weight"), v("attn.c_proj.bias"), v("ln_2.weight"), v("ln_2.bias"),
                   v("mlp.c_fc.weight"), v("mlp.c_fc.bias"), v("mlp.c_proj.weight"),
                   v("mlp.c_proj.bias")});
  }
  if (stage.head) {
    p.lnfw = lay.view(flat, "ln_f.weight");
    p.lnfb = lay.view(flat, "ln_f.bias");
  }
  return p;
}

namespace {

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
Tensor allocate_bytes(gpu::Device& device, std::int64_t bytes) {
  return Tensor::empty(device, gpu::DType::kF32, {bytes / 4});
}

// How layer l of a chunk of L layers keeps its activations.
struct LayerKeep {
  enum class Mode { kAll, kNoScores, kRecomputed };
  Mode mode = Mode::kAll;
  int pos = 0;               // kRecomputed: position in its group (the workspace layer)
  int group_first = 0;       // kRecomputed: the group's first layer
  bool keeps_output = true;  // kRecomputed: the group's last layer (its output is kept)
};

LayerKeep layer_keep(const ActivationOptions& o, int L, int l) {
  LayerKeep k;
  switch (o.recompute) {
    case Recompute::kNone:
      return k;
    case Recompute::kSelective:
      if (o.recomputes_scores()) k.mode = LayerKeep::Mode::kNoScores;
      return k;
    case Recompute::kFull:
      break;
  }
  const int N = o.recompute_layers;
  if (o.method == RecomputeMethod::kBlock) {
    if (l >= N) return k;
    k.mode = LayerKeep::Mode::kRecomputed;
    k.group_first = l;
    return k;
  }
  k.mode = LayerKeep::Mode::kRecomputed;
  k.group_first = l / N * N;
  k.pos = l - k.group_first;
  k.keeps_output = l == std::min(k.group_first + N, L) - 1;
  return k;
}

// Layers of the full-recompute workspace (the largest group).
int workspace_layers(const ActivationOptions& o, int L) {
  if (o.recompute != Recompute::kFull) return 0;
  return o.method == RecomputeMethod::kBlock ? std::min(1, L) : std::min(o.recompute_layers, L);
}

struct Dims {
  std::int64_t B, T, C, Cl, NHl;
  int tp;
  bool sp;     // sequence parallel
  bool flash;  // flash attention (lse), or the reference kernel (att)
  // The LayerNorm and residual region: (B, T, C) and (B, T), or this
  // rank's B*T/tp rows of them.
  gpu::Shape rows_c() const { return sp ? gpu::Shape{B * T / tp, C} : gpu::Shape{B, T, C}; }
  gpu::Shape rows() const { return sp ? gpu::Shape{B * T / tp} : gpu::Shape{B, T}; }
};

Dims dims(const GptConfig& c, std::int64_t B, int tp, const ActivationOptions& o = {}) {
  return {B,
          c.T,
          c.C,
          c.C / tp,
          c.NH / tp,
          tp,
          o.sequence_parallel && tp > 1,
          o.attention != AttentionKernel::kReference};
}

// A layer's tensors: all of them, or without att (selective), or only the
// output.
enum class Take { kAll, kNoScores, kOutput, kNothing };

LayerActivations carve_layer(const Dims& d, Take take, Carver& k) {
  LayerActivations x;
  if (take == Take::kAll || take == Take::kNoScores) {
    const std::int64_t B = d.B, T = d.T;
    x.ln1 = k.take(d.rows_c());
    x.ln1_mean = k.take32(d.rows());
    x.ln1_rstd = k.take32(d.rows());
    x.qkv = k.take({B, T, 3 * d.Cl});
    if (d.flash) {
      x.lse = k.take32({B, d.NHl, T});
    } else if (take == Take::kAll) {
      x.att = k.take({B, d.NHl, T, T});
    }
    x.atty = k.take({B, T, d.Cl});
    x.residual2 = k.take(d.rows_c());
    x.ln2 = k.take(d.rows_c());
    x.ln2_mean = k.take32(d.rows());
    x.ln2_rstd = k.take32(d.rows());
    x.fch = k.take({B, T, 4 * d.Cl});
    x.fch_gelu = k.take({B, T, 4 * d.Cl});
  }
  if (take != Take::kNothing) x.residual3 = k.take(d.rows_c());
  return x;
}

GptActivations carve_activations(const GptConfig& c, const StageSpec& stage, std::int64_t B, int tp,
                                 const ActivationOptions& o, Carver& k) {
  const Dims d = dims(c, B, tp, o);
  const std::int64_t T = c.T, Vl = c.Vp() / tp;
  const std::int64_t H = stage.head ? 1 : 0;  // the head's tensors are empty without it
  const std::int64_t P = tp > 1 ? 1 : 0;      // vocab-parallel softmax buffers
  const gpu::Shape none{0};
  GptActivations a;
  a.encoded = k.take(stage.embedding ? d.rows_c() : none);
  const int L = stage.layers();
  for (int l = 0; l < L; l++) {
    const LayerKeep keep = layer_keep(o, L, l);
    switch (keep.mode) {
      case LayerKeep::Mode::kAll:
        a.layers.push_back(carve_layer(d, Take::kAll, k));
        break;
      case LayerKeep::Mode::kNoScores:
        a.layers.push_back(carve_layer(d, Take::kNoScores, k));
        break;
      case LayerKeep::Mode::kRecomputed:
        a.layers.push_back(carve_layer(d, keep.keeps_output ? Take::kOutput : Take::kNothing, k));
        break;
    }
  }
  a.lnf = k.take(stage.head ? d.rows_c() : none);
  a.lnf_mean = k.take32(stage.head ? d.rows() : none);
  a.lnf_rstd = k.take32(stage.head ? d.rows() : none);
  a.logits = k.take({H * B, T, Vl});
  a.lse = k.take32({H * B, T});
  a.losses = k.take32({H * B, T});
  a.ce_stats = k.take32({P * H * B * T, 3});
  a.ce_gathered = k.take32({tp, P * H * B * T, 3});
  a.dresidual = k.take(d.rows_c());
  return a;
}

GptScratch carve_scratch(const GptConfig& c, std::int64_t B, int tp, const ActivationOptions& o,
                         Carver& k) {
  const Dims d = dims(c, B, tp, o);
  GptScratch x;
  x.btc = k.take({B, d.T, d.C});
  x.dbtc = k.take({B, d.T, d.C});
  x.datty = k.take({B, d.T, d.Cl});
  x.dqkv = k.take({B, d.T, 3 * d.Cl});
  if (d.flash) {
    x.delta = k.take32({B, d.NHl, d.T});
  } else {
    x.datt = k.take({B, d.NHl, d.T, d.T});
  }
  x.dfch = k.take({B, d.T, 4 * d.Cl});
  if (d.sp) {
    x.gathered = k.take({B, d.T, d.C});
    x.rows = k.take(d.rows_c());
    x.ln_grads = k.take32({2, d.C});
    if (x.ln_grads.defined()) {
      x.ln_dw = x.ln_grads.view(0, {d.C});
      x.ln_db = x.ln_grads.view(d.C, {d.C});
    }
  }
  return x;
}

std::vector<LayerActivations> carve_workspace(const GptConfig& c, const StageSpec& stage,
                                              std::int64_t B, int tp, const ActivationOptions& o,
                                              Carver& k) {
  const Dims d = dims(c, B, tp, o);
  std::vector<LayerActivations> work;
  if (o.recomputes_scores() && stage.layers() > 0) {
    LayerActivations x;
    x.att = k.take({B, d.NHl, d.T, d.T});
    x.atty = k.take({B, d.T, d.Cl});
    work.push_back(x);
  }
  for (int p = 0; p < workspace_layers(o, stage.layers()); p++) {
    work.push_back(carve_layer(d, Take::kAll, k));
  }
  return work;
}

}  // namespace

std::int64_t counted_slot_bytes(const GptConfig& config, const StageSpec& stage, std::int64_t B,
                                int tp, const ActivationOptions& o) {
  std::int64_t total = 0;
  Carver sizer(&total, gpu::compute_dtype(o.precision));
  carve_activations(config, stage, B, tp, o, sizer);
  return total;
}

std::int64_t counted_workspace_bytes(const GptConfig& config, const StageSpec& stage,
                                     std::int64_t B, int tp, const ActivationOptions& o) {
  std::int64_t total = 0;
  Carver sizer(&total, gpu::compute_dtype(o.precision));
  carve_workspace(config, stage, B, tp, o, sizer);
  return total;
}

std::int64_t counted_scratch_bytes(const GptConfig& config, std::int64_t B, int tp,
                                   const ActivationOptions& o) {
  std::int64_t total = 0;
  Carver sizer(&total, gpu::compute_dtype(o.precision));
  carve_scratch(config, B, tp, o, sizer);
  return total;
}

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device)
    : Gpt(config, B, device, StageSpec::whole(config)) {}

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device, const StageSpec& stage, int slots,
         TensorParallel tp, const ActivationOptions& activations)
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
  Tensor flat = allocate_bytes(device, per_slot * slots);
  slot_bytes_ = slots > 0 ? (device.allocated_bytes() - before) / slots : 0;
  for (int k = 0; k < slots; k++) {
    std::int64_t used = per_slot * k;
    Carver carver(&used, A);
    carver.bind(flat);
    slots_.push_back(carve_activations(config, stage, B, P, act_, carver));
  }
  if (const std::int64_t n = counted_workspace_bytes(config, stage, B, P, act_); n > 0) {
    before = device.allocated_bytes();
    Tensor work = allocate_bytes(device, n);
    workspace_bytes_ = device.allocated_bytes() - before;
    std::int64_t used = 0;
    Carver carver(&used, A);
    carver.bind(work);
    work_ = carve_workspace(config, stage, B, P, act_, carver);
  }
  {
    before = device.allocated_bytes();
    Tensor scratch = allocate_bytes(device, counted_scratch_bytes(config, B, P, act_));
    scratch_bytes_ = device.allocated_bytes() - before;
    std::int64_t used = 0;
    Carver carver(&used, A);
    carver.bind(scratch);
    scratch_ = carve_scratch(config, B, P, act_, carver);
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
                             const Tensor& dout, const Tensor& inp, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd) {
  if (!sequence_parallel()) {
    ops::layernorm_backward(s, dinp, dw, db, dout, inp, w, mean, rstd);
    return;
  }
  // This rank's rows' part of dw and db, summed over the TP group, then
  // added (every peer adds the same sum).
  ops::fill(s, scratch_.ln_grads, 0.0f);
  ops::layernorm_backward(s, dinp, scratch_.ln_dw, scratch_.ln_db, dout, inp, w, mean, rstd);
  all_reduce(s, scratch_.ln_grads);  // one collective for both
  ops::axpy(s, dw, 1.0f, scratch_.ln_dw);
  ops::axpy(s, db, 1.0f, scratch_.ln_db);
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

void Gpt::zero_grad(gpu::Stream& s) { ops::fill(s, grads_flat_, 0.0f); }

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
                   const Tensor& dout, int slot, const GradProgress& progress) {
  auto reached = [&](GradPoint::Part part, int layer) {
    if (progress) progress({part, layer});
  };
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
    ops::matmul_backward(s, scratch_.dbtc, g_.wte, Tensor{}, a.logits, gathered(s, a.lnf), p_.wte,
                         Accumulate::kNo);
    // Each rank's vocabulary slice contributed a part.
    layernorm_backward(s, a.dresidual, g_.lnfw, g_.lnfb, reduced(s, scratch_.dbtc), output(slot),
                       p_.lnfw, a.lnf_mean, a.lnf_rstd);
    reached(GradPoint::Part::kHead, -1);
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
    reached(GradPoint::Part::kLayer, stage_.first_layer + l);
  }
  if (stage_.embedding) {
    ops::embedding_backward(s, g_.wte, g_.wpe, gathered(s, a.dresidual), tokens, vocab_slice());
    reached(GradPoint::Part::kEmbedding, -1);
  }
}

// On entry a.dresidual holds d(residual3[l]); on exit d(residual), the
// layer's input. The residual connections pass it through unchanged; each
// branch's LayerNorm backward adds its part.
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
  ops::matmul_backward_gelu(s, scratch_.dfch, g.fcb, g.fcprojw, g.fcprojb, gathered(s, a.dresidual),
                            x.fch_gelu, p.fcprojw, x.fch);
  ops::matmul_backward(s, scratch_.dbtc, g.fcw, Tensor{}, scratch_.dfch, gathered(s, x.ln2), p.fcw,
                       Accumulate::kNo);
  // Column-parallel input: each rank's columns gave a part.
  layernorm_backward(s, a.dresidual, g.ln2w, g.ln2b, reduced(s, scratch_.dbtc), x.residual2, p.ln2w,
                     x.ln2_mean, x.ln2_rstd);
  // Attention branch.
  ops::matmul_backward(s, scratch_.datty, g.attprojw, g.attprojb, gathered(s, a.dresidual), x.atty,
                       p.attprojw, Accumulate::kNo);
  // Selective recompute: the scores and softmax again, from the kept q, k,
  // v (the output, the same as the kept atty, goes to the workspace).
  if (act_.attention != AttentionKernel::kReference) {
    ops::flash_attention_backward(s, scratch_.dqkv, scratch_.delta, scratch_.datty, x.qkv, x.atty,
                                  x.lse);
  } else {
    if (act_.recomputes_scores()) ops::attention_forward(s, work_[0].atty, x.att, x.qkv);
    ops::attention_backward(s, scratch_.dqkv, scratch_.datt, scratch_.datty, x.qkv, x.att);
  }
  ops::matmul_backward(s, scratch_.dbtc, g.qkvw, g.qkvb, scratch_.dqkv, gathered(s, x.ln1), p.qkvw,
                       Accumulate::kNo);
  layernorm_backward(s, a.dresidual, g.ln1w, g.ln1b, reduced(s, scratch_.dbtc), residual, p.ln1w,
                     x.ln1_mean, x.ln1_rstd);
}

}  // namespace troupe::model
