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
                                 Carver& k) {
  const std::int64_t L = stage.layers(), T = c.T, C = c.C, NH = c.NH;
  const std::int64_t H = stage.head ? 1 : 0;  // the head's tensors are empty without it
  GptActivations a;
  a.encoded = k.take({stage.embedding ? B : 0, T, C});
  a.ln1 = k.take({L, B, T, C});
  a.ln1_mean = k.take({L, B, T});
  a.ln1_rstd = k.take({L, B, T});
  a.qkv = k.take({L, B, T, 3 * C});
  a.att = k.take({L, B, NH, T, T});
  a.atty = k.take({L, B, T, C});
  a.residual2 = k.take({L, B, T, C});
  a.ln2 = k.take({L, B, T, C});
  a.ln2_mean = k.take({L, B, T});
  a.ln2_rstd = k.take({L, B, T});
  a.fch = k.take({L, B, T, 4 * C});
  a.fch_gelu = k.take({L, B, T, 4 * C});
  a.residual3 = k.take({L, B, T, C});
  a.lnf = k.take({H * B, T, C});
  a.lnf_mean = k.take({H * B, T});
  a.lnf_rstd = k.take({H * B, T});
  a.logits = k.take({H * B, T, c.Vp()});
  a.lse = k.take({H * B, T});
  a.losses = k.take({H * B, T});
  a.scratch_btc = k.take({B, T, C});
  a.dresidual = k.take({B, T, C});
  a.dbtc = k.take({B, T, C});
  a.dqkv = k.take({B, T, 3 * C});
  a.datt = k.take({B, NH, T, T});
  a.dfch = k.take({B, T, 4 * C});
  return a;
}

// Layer l's slice of an (L, ...) activation.
Tensor at(const Tensor& t, int l) {
  gpu::Shape shape(t.shape.begin() + 1, t.shape.end());
  return t.view(l * gpu::shape_numel(shape), shape);
}

}  // namespace

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device)
    : Gpt(config, B, device, StageSpec::whole(config)) {}

Gpt::Gpt(const GptConfig& config, int B, gpu::Device& device, const StageSpec& stage, int slots)
    : config_(config),
      stage_(stage),
      B_(B),
      device_(device),
      layout_(ParamLayout::gpt(config, stage)) {
  params_flat_ = Tensor::empty(device, gpu::DType::kF32, {layout_.total()});
  grads_flat_ = Tensor::empty(device, gpu::DType::kF32, {layout_.total()});
  p_ = GptParams::carve(layout_, params_flat_, stage);
  g_ = GptParams::carve(layout_, grads_flat_, stage);
  std::int64_t per_slot = 0;
  Carver sizer(&per_slot);
  carve_activations(config, stage, B, sizer);
  Tensor flat = Tensor::empty(device, gpu::DType::kF32, {per_slot * slots});
  for (int k = 0; k < slots; k++) {
    std::int64_t used = per_slot * k;
    Carver carver(&used);
    carver.bind(flat);
    slots_.push_back(carve_activations(config, stage, B, carver));
  }
  inputs_.resize(static_cast<std::size_t>(slots));
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
    ops::embedding_forward(s, a.encoded, tokens, p_.wte, p_.wpe);
    in = a.encoded;
  } else {
    in = input;
  }
  for (int l = 0; l < L; l++) layer_forward(s, a, l, l == 0 ? in : at(a.residual3, l - 1));
  if (!stage_.head) return;
  ops::layernorm_forward(s, a.lnf, a.lnf_mean, a.lnf_rstd, at(a.residual3, L - 1), p_.lnfw,
                         p_.lnfb);
  ops::matmul_forward(s, a.logits, a.lnf, p_.wte, Tensor{});
  if (targets.defined()) {
    ops::crossentropy_forward(s, a.losses.reshape({B_ * config_.T}),
                              a.lse.reshape({B_ * config_.T}),
                              a.logits.reshape({B_ * config_.T, config_.Vp()}),
                              targets.reshape({B_ * config_.T}), config_.V);
  }
}

void Gpt::layer_forward(gpu::Stream& s, GptActivations& a, int l, const Tensor& residual) {
  const LayerParams& p = p_.h[l];
  Tensor ln1 = at(a.ln1, l), qkv = at(a.qkv, l), atty = at(a.atty, l);
  Tensor residual2 = at(a.residual2, l), ln2 = at(a.ln2, l);
  Tensor fch = at(a.fch, l), fch_gelu = at(a.fch_gelu, l);
  ops::layernorm_forward(s, ln1, at(a.ln1_mean, l), at(a.ln1_rstd, l), residual, p.ln1w, p.ln1b);
  ops::matmul_forward(s, qkv, ln1, p.qkvw, p.qkvb);
  ops::attention_forward(s, atty, at(a.att, l), qkv);
  ops::matmul_forward(s, a.scratch_btc, atty, p.attprojw, p.attprojb);
  ops::residual_forward(s, residual2, residual, a.scratch_btc);
  ops::layernorm_forward(s, ln2, at(a.ln2_mean, l), at(a.ln2_rstd, l), residual2, p.ln2w, p.ln2b);
  ops::matmul_forward(s, fch, ln2, p.fcw, p.fcb);
  ops::gelu_forward(s, fch_gelu, fch);
  ops::matmul_forward(s, a.scratch_btc, fch_gelu, p.fcprojw, p.fcprojb);
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
    Tensor logits = a.logits.reshape({N, config_.Vp()});
    ops::crossentropy_backward(s, logits, logits, a.lse.reshape({N}), targets.reshape({N}), dloss,
                               config_.V);
    // The LM head shares wte with the token embedding: both add into g_.wte.
    ops::matmul_backward(s, a.dbtc, g_.wte, Tensor{}, a.logits, a.lnf, p_.wte, Accumulate::kNo);
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
    ops::embedding_backward(s, g_.wte, g_.wpe, a.dresidual, tokens);
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
  ops::layernorm_backward(s, a.dresidual, g.ln2w, g.ln2b, a.dbtc, residual2, p.ln2w,
                          at(a.ln2_mean, l), at(a.ln2_rstd, l));
  // Attention branch.
  ops::matmul_backward(s, a.dbtc, g.attprojw, g.attprojb, a.dresidual, atty, p.attprojw,
                       Accumulate::kNo);
  ops::attention_backward(s, a.dqkv, a.datt, a.dbtc, qkv, at(a.att, l));
  ops::matmul_backward(s, a.dbtc, g.qkvw, g.qkvb, a.dqkv, ln1, p.qkvw, Accumulate::kNo);
  ops::layernorm_backward(s, a.dresidual, g.ln1w, g.ln1b, a.dbtc, residual, p.ln1w,
                          at(a.ln1_mean, l), at(a.ln1_rstd, l));
}

}  // namespace troupe::model
