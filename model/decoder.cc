// Generation's forward: Gpt::forward's ops over the new positions only, the
// attention reading the earlier ones' k and v from the cache.
#include "model/decoder.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu/host_values.h"
#include "gpu/ops.h"

namespace troupe::model {

using gpu::Tensor;
namespace ops = gpu::ops;

Decoder::Decoder(const GptConfig& config, gpu::Device& device, const StageSpec& stage,
                 TensorParallel tp, int B, gpu::DType dtype, AttentionKernel attention)
    : config_(config),
      stage_(stage),
      tp_(std::move(tp)),
      B_(B),
      layout_(ParamLayout::gpt(config, stage, tp_.slice)) {
  const std::int64_t T = config.T, C = config.C, P = tp_.slice.tp;
  const std::int64_t Cl = C / P, NHl = config.NH / P, HS = C / config.NH, Vl = config.Vp() / P;
  gpu::check_invariant(gpu::is_compute_dtype(dtype) ? absl::OkStatus()
                                                    : absl::InvalidArgumentError(absl::StrCat(
                                                          "dtype ", gpu::dtype_name(dtype))),
                       "Decoder: a compute dtype (f32, bf16, f16)");
  auto empty = [&](const gpu::Shape& shape) { return Tensor::empty(device, dtype, shape); };
  auto empty32 = [&](const gpu::Shape& shape) {
    return Tensor::empty(device, gpu::DType::kF32, shape);
  };
  params_flat_ = empty({layout_.total()});
  p_ = GptParams::carve(layout_, params_flat_, stage);
  for (int l = 0; l < stage.layers(); l++) {
    kcache_.push_back(empty({B, NHl, T, HS}));
    vcache_.push_back(empty({B, NHl, T, HS}));
  }
  h_ = empty({B, T, C});
  res2_ = empty({B, T, C});
  ln_ = empty({B, T, C});
  mean_ = empty32({B, T});
  rstd_ = empty32({B, T});
  if (stage.layers() > 0) {
    qkv_ = empty({B, T, 3 * Cl});
    if (resolve_attention_kernel(attention, device.kind()) == AttentionKernel::kReference) {
      att_ = empty({B, NHl, T, T});
    }
    atty_ = empty({B, T, Cl});
    proj_ = empty({B, T, C});
    fch_ = empty({B, T, 4 * Cl});
    fch_gelu_ = empty({B, T, 4 * Cl});
  }
  if (stage.head) {
    logits_ = empty({B, T, Vl});
    if (P > 1) gathered_ = empty({P, B, T, Vl});
  }
  if (stage.embedding && tp_.slice.t > 0) {
    zero_wpe_ = empty({T, C});
    const std::vector<float> zeros(static_cast<std::size_t>(zero_wpe_.numel()), 0.0f);
    (void)gpu::copy_values_to_device(zeros, zero_wpe_);  // (a fresh tensor of the right size)
  }
}

Tensor Decoder::first(const Tensor& buf, std::int64_t n) {
  const std::int64_t B = buf.size(0), cols = buf.size(-1);
  return buf.view(0, {B, n, cols});
}

void Decoder::all_reduce(gpu::Stream& s, const Tensor& x) {
  if (tp_.slice.tp > 1) tp_.all_reduce(s, x);
}

gpu::VocabSlice Decoder::vocab_slice() const {
  if (tp_.slice.tp == 1) return {};
  const std::int64_t rows = config_.Vp() / tp_.slice.tp;
  return {.begin = tp_.slice.t * rows, .total = config_.V};
}

Tensor Decoder::output() const { return first(h_, n_); }

Tensor Decoder::logits() const { return first(logits_, which_ == Logits::kLast ? 1 : n_); }

Tensor Decoder::gathered_logits(gpu::Stream& s) {
  const Tensor mine = logits();
  if (tp_.slice.tp == 1) return mine;
  const Tensor all = gathered_.view(0, {tp_.slice.tp, mine.size(0), mine.size(1), mine.size(2)});
  tp_.all_gather(s, mine, all);
  return all;
}

Tensor Decoder::input(std::int64_t n) const { return first(h_, n); }

void Decoder::forward(gpu::Stream& s, const Tensor& tokens, std::int64_t n, std::int64_t pos,
                      Logits which) {
  const std::int64_t C = config_.C, T = config_.T;
  if (n < 1 || pos < 0 || pos + n > T) {
    s.fail(absl::InvalidArgumentError(absl::StrCat("Decoder::forward: positions ", pos, "..",
                                                   pos + n - 1, " are outside the context of ", T,
                                                   " positions")));
    return;
  }
  n_ = n;
  which_ = which;
  const Tensor h = first(h_, n);
  if (stage_.embedding) {
    // Vocab-parallel, as Gpt::forward: each rank its rows, rank 0 the
    // positions pos.., the all-reduce the sum.
    const Tensor& wpe = tp_.slice.t > 0 ? zero_wpe_ : p_.wpe;
    ops::embedding_forward(s, h, tokens, p_.wte, wpe.view(pos * C, {T - pos, C}), vocab_slice());
    all_reduce(s, h);
  }
  for (int l = 0; l < stage_.layers(); l++) layer_forward(s, l, pos, n);
  if (!stage_.head) return;
  const Tensor ln = first(ln_, n), mean = mean_.view(0, {B_, n}), rstd = rstd_.view(0, {B_, n});
  ops::layernorm_forward(s, ln, mean, rstd, h, p_.lnfw, p_.lnfb);
  if (which == Logits::kAll) {
    ops::matmul_forward(s, logits(), ln, p_.wte, Tensor{});
    return;
  }
  const std::int64_t Vl = logits_.size(-1);
  for (std::int64_t b = 0; b < B_; b++) {
    ops::matmul_forward(s, logits_.view(b * Vl, {1, 1, Vl}),
                        ln.view((b * n + n - 1) * C, {1, 1, C}), p_.wte, Tensor{});
  }
}

void Decoder::layer_forward(gpu::Stream& s, int l, std::int64_t pos, std::int64_t n) {
  const LayerParams& p = p_.h[static_cast<std::size_t>(l)];
  const Tensor h = first(h_, n), res2 = first(res2_, n), ln = first(ln_, n), proj = first(proj_, n),
               qkv = first(qkv_, n), atty = first(atty_, n), fch = first(fch_, n),
               fch_gelu = first(fch_gelu_, n);
  const Tensor mean = mean_.view(0, {B_, n}), rstd = rstd_.view(0, {B_, n});
  ops::layernorm_forward(s, ln, mean, rstd, h, p.ln1w, p.ln1b);
  ops::matmul_forward(s, qkv, ln, p.qkvw, p.qkvb);
  const Tensor& kc = kcache_[static_cast<std::size_t>(l)];
  const Tensor& vc = vcache_[static_cast<std::size_t>(l)];
  if (att_.defined()) {
    ops::attention_cached(s, atty, att_.view(0, {B_, att_.size(1), n, config_.T}), kc, vc, qkv,
                          pos);
  } else {
    ops::flash_attention_cached(s, atty, kc, vc, qkv, pos);
  }
  // Row-parallel projections: partial sums, the bias added once (rank 0).
  const bool bias = tp_.slice.t == 0;
  ops::matmul_forward(s, proj, atty, p.attprojw, bias ? p.attprojb : Tensor{});
  all_reduce(s, proj);
  ops::residual_layernorm_forward(s, res2, ln, mean, rstd, h, proj, p.ln2w, p.ln2b);
  ops::matmul_gelu_forward(s, fch_gelu, fch, ln, p.fcw, p.fcb);
  ops::matmul_forward(s, proj, fch_gelu, p.fcprojw, bias ? p.fcprojb : Tensor{});
  all_reduce(s, proj);
  ops::residual_forward(s, h, res2, proj);
}

}  // namespace troupe::model
