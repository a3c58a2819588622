// GPT-2 forward and backward, one named op per step, as in the paper.
#include "model/gpt.h"

#include <vector>

#include "absl/strings/str_cat.h"
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

// Carves activations out of one allocation.
class Carver {
 public:
  explicit Carver(std::int64_t* total) : total_(total) {}
  void bind(Tensor flat) { flat_ = std::move(flat); }
  Tensor take(const gpu::Shape& shape) {
    const std::int64_t n = (gpu::shape_numel(shape) + 15) / 16 * 16;
    Tensor t;
    if (flat_.defined()) t = flat_.view(*total_, shape);
    *total_ += n;
    return t;
  }

 private:
  std::int64_t* total_;
  Tensor flat_;
};

GptActivations carve_activations(const GptConfig& c, const StageSpec& stage, std::int64_t B,
                                 int tp, Carver& k) {
  const std::int64_t L = stage.layers(), T = c.T, C = c.C;
  const std::int64_t Cl = C / tp, NHl = c.NH / tp, Vl = c.Vp() / tp;
  const std::int64_t H = stage.head ? 1 : 0;  // the head's tensors are empty without it
  const std::int64_t P = tp > 1 ? 1 : 0;      // vocab-parallel softmax buffers
  GptActivations a;
  a.encoded = k.take({stage.embedding ? B : 0, T, C});
  a.ln1 = k.take({L, B, T, C});
  a.ln1_mean = k.take({L, B, T});
  a.ln1_rstd = k.take({L, B, T});
  a.qkv = k.take({L, B, T, 3 * Cl});
  a.att = k.take({L, B, NHl, T, T});
  a.atty = k.take({L, B, T, Cl});
  a.residual2 = k.take({L, B, T, C});
  a.ln2 = k.take({L, B, T, C});
  a.ln2_mean = k.take({L, B, T});
  a.ln2_rstd = k.take({L, B, T});
  a.fch = k.take({L, B, T, 4 * Cl});
  a.fch_gelu = k.take({L, B, T, 4 * Cl});
  a.residual3 = k.take({L, B, T, C});
  a.lnf = k.take({H * B, T, C});
  a.lnf_mean = k.take({H * B, T});
  a.lnf_rstd = k.take({H * B, T});
  a.logits = k.take({H * B, T, Vl});
  a.lse = k.take({H * B, T});
  a.losses = k.take({H * B, T});
  a.ce_stats = k.take({P * H * B * T, 3});
  a.ce_gathered = k.take({tp, P * H * B * T, 3});
  a.scratch_btc = k.take({B, T, C});
  a.dresidual = k.take({B, T, C});
  a.dbtc = k.take({B, T, C});
  a.datty = k.take({B, T, Cl});
  a.dqkv = k.take({B, T, 3 * Cl});
  a.datt = k.take({B, NHl, T, T});
  a.dfch = k.take({B, T, 4 * Cl});
  return a;
}

// Layer l's slice of an (L, ...) activation.
Tensor at(const Tensor& t, int l) {
  gpu::Shape shape(t.shape.begin() + 1, t.shape.end());
  return t.view(l * gpu::shape_numel(shape), shape);
}

}  // namespace

std::int64_t activation_floats_per_slot(const GptConfig& config, const StageSpec& stage,
                                        std::int64_t B, int tp) {
  std::int64_t total = 0;
  Carver sizer(&total);
  carve_activations(config, stage, B, tp, sizer);
  return total;
}

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device)
    : Gpt(config, B, device, StageSpec::whole(config)) {}

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device, const StageSpec& stage, int slots,
         TensorParallel tp)
    : config_(config),
      stage_(stage),
      tp_(std::move(tp)),
      B_(B),
      device_(device),
      layout_(ParamLayout::gpt(config, stage, tp_.slice)) {
  const int P = tp_.slice.tp;
  params_flat_ = Tensor::empty(device, gpu::DType::kF32, {layout_.total()});
  grads_flat_ = Tensor::empty(device, gpu::DType::kF32, {layout_.total()});
  p_ = GptParams::carve(layout_, params_flat_, stage);
  g_ = GptParams::carve(layout_, grads_flat_, stage);
  const std::int64_t per_slot = activation_floats_per_slot(config, stage, B, P);
  Tensor flat = Tensor::empty(device, gpu::DType::kF32, {per_slot * slots});
  for (int k = 0; k < slots; k++) {
    std::int64_t used = per_slot * k;
    Carver carver(&used);
    carver.bind(flat);
    slots_.push_back(carve_activations(config, stage, B, P, carver));
  }
  inputs_.resize(static_cast<std::size_t>(slots));
  if (stage.embedding && tp_.slice.t > 0) {
    zero_wpe_ = Tensor::empty(device, gpu::DType::kF32, {config.T, config.C});
    std::vector<float> zeros(static_cast<std::size_t>(zero_wpe_.numel()), 0.0f);
    (void)device.copy_from_host(zeros.data(), zero_wpe_);
  }
}

void Gpt::all_reduce(gpu::Stream& s, const Tensor& x) {
  if (tp_.slice.tp > 1) tp_.all_reduce(s, x);
}

gpu::VocabSlice Gpt::vocab_slice() const {
  if (tp_.slice.tp == 1) return {};
  const std::int64_t rows = config_.Vp() / tp_.slice.tp;
  return {.begin = tp_.slice.t * rows, .total = config_.V};
}

Tensor Gpt::output(int slot) const { return at(acts(slot).residual3, stage_.layers() - 1); }

void Gpt::init(std::uint64_t seed) {
  std::vector<float> host(static_cast<std::size_t>(layout_.total()), 0.0f);
  for (const ParamSpec& spec : layout_.specs()) {
    init_values(
        config_, spec, seed, 0,
        std::span<float>(host.data() + spec.offset, static_cast<std::size_t>(spec.numel())));
  }
  absl::Status st = device_.copy_from_host(host.data(), params_flat_);
  (void)st;  // same device by construction
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
    const Tensor& wpe = tp_.slice.t > 0 ? zero_wpe_ : p_.wpe;
    ops::embedding_forward(s, a.encoded, tokens, p_.wte, wpe, vocab_slice());
    all_reduce(s, a.encoded);
    in = a.encoded;
  } else {
    in = input;
  }
  for (int l = 0; l < L; l++) layer_forward(s, a, l, l == 0 ? in : at(a.residual3, l - 1));
  if (!stage_.head) return;
  ops::layernorm_forward(s, a.lnf, a.lnf_mean, a.lnf_rstd, at(a.residual3, L - 1), p_.lnfw,
                         p_.lnfb);
  ops::matmul_forward(s, a.logits, a.lnf, p_.wte, Tensor{});
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

void Gpt::layer_forward(gpu::Stream& s, GptActivations& a, int l, const Tensor& residual) {
  const LayerParams& p = p_.h[l];
  Tensor ln1 = at(a.ln1, l), qkv = at(a.qkv, l), atty = at(a.atty, l);
  Tensor residual2 = at(a.residual2, l), ln2 = at(a.ln2, l);
  Tensor fch = at(a.fch, l), fch_gelu = at(a.fch_gelu, l);
  ops::layernorm_forward(s, ln1, at(a.ln1_mean, l), at(a.ln1_rstd, l), residual, p.ln1w, p.ln1b);
  ops::matmul_forward(s, qkv, ln1, p.qkvw, p.qkvb);
  ops::attention_forward(s, atty, at(a.att, l), qkv);
  // Row-parallel projections: partial sums, completed by the all-reduce; the
  // bias is added once (by rank 0).
  const bool bias = tp_.slice.t == 0;
  ops::matmul_forward(s, a.scratch_btc, atty, p.attprojw, bias ? p.attprojb : Tensor{});
  all_reduce(s, a.scratch_btc);
  ops::residual_forward(s, residual2, residual, a.scratch_btc);
  ops::layernorm_forward(s, ln2, at(a.ln2_mean, l), at(a.ln2_rstd, l), residual2, p.ln2w, p.ln2b);
  ops::matmul_forward(s, fch, ln2, p.fcw, p.fcb);
  ops::gelu_forward(s, fch_gelu, fch);
  ops::matmul_forward(s, a.scratch_btc, fch_gelu, p.fcprojw, bias ? p.fcprojb : Tensor{});
  all_reduce(s, a.scratch_btc);
  ops::residual_forward(s, at(a.residual3, l), residual2, a.scratch_btc);
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
    ops::matmul_backward(s, a.dbtc, g_.wte, Tensor{}, a.logits, a.lnf, p_.wte, Accumulate::kNo);
    all_reduce(s, a.dbtc);  // each rank's vocabulary slice contributed a part
    ops::layernorm_backward(s, a.dresidual, g_.lnfw, g_.lnfb, a.dbtc, at(a.residual3, L - 1),
                            p_.lnfw, a.lnf_mean, a.lnf_rstd);
    reached(GradPoint::Part::kHead, -1);
  } else {
    ops::axpy(s, a.dresidual, 1.0f, dout);  // the next stage's gradient of our output
  }
  for (int l = L - 1; l >= 0; l--) {
    layer_backward(s, a, l, l == 0 ? in : at(a.residual3, l - 1));
    reached(GradPoint::Part::kLayer, stage_.first_layer + l);
  }
  if (stage_.embedding) {
    ops::embedding_backward(s, g_.wte, g_.wpe, a.dresidual, tokens, vocab_slice());
    reached(GradPoint::Part::kEmbedding, -1);
  }
}

// On entry a.dresidual holds d(residual3[l]); on exit d(residual), the
// layer's input. The residual connections pass it through unchanged; each
// branch's LayerNorm backward adds its part.
void Gpt::layer_backward(gpu::Stream& s, GptActivations& a, int l, const Tensor& residual) {
  const LayerParams& p = p_.h[l];
  const LayerParams& g = g_.h[l];
  Tensor ln1 = at(a.ln1, l), qkv = at(a.qkv, l), atty = at(a.atty, l);
  Tensor residual2 = at(a.residual2, l), ln2 = at(a.ln2, l);
  Tensor fch = at(a.fch, l), fch_gelu = at(a.fch_gelu, l);
  // MLP branch.
  ops::matmul_backward(s, a.dfch, g.fcprojw, g.fcprojb, a.dresidual, fch_gelu, p.fcprojw,
                       Accumulate::kNo);
  ops::gelu_backward(s, a.dfch, fch, a.dfch);
  ops::matmul_backward(s, a.dbtc, g.fcw, g.fcb, a.dfch, ln2, p.fcw, Accumulate::kNo);
  all_reduce(s, a.dbtc);  // column-parallel input: each rank's columns gave a part
  ops::layernorm_backward(s, a.dresidual, g.ln2w, g.ln2b, a.dbtc, residual2, p.ln2w,
                          at(a.ln2_mean, l), at(a.ln2_rstd, l));
  // Attention branch.
  ops::matmul_backward(s, a.datty, g.attprojw, g.attprojb, a.dresidual, atty, p.attprojw,
                       Accumulate::kNo);
  ops::attention_backward(s, a.dqkv, a.datt, a.datty, qkv, at(a.att, l));
  ops::matmul_backward(s, a.dbtc, g.qkvw, g.qkvb, a.dqkv, ln1, p.qkvw, Accumulate::kNo);
  all_reduce(s, a.dbtc);
  ops::layernorm_backward(s, a.dresidual, g.ln1w, g.ln1b, a.dbtc, residual, p.ln1w,
                          at(a.ln1_mean, l), at(a.ln1_rstd, l));
}

}  // namespace troupe::model
