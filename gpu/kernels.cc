// Default op implementations: each records Unimplemented on the stream,
// except the fused ops, which run their unfused sequence.
#include "gpu/kernels.h"

#include "absl/strings/str_cat.h"

namespace troupe::gpu {

void Kernels::unimplemented(Stream& s, absl::string_view op) {
  s.fail(absl::UnimplementedError(absl::StrCat(op, " is not implemented on ", s.device().name())));
}

void Kernels::embedding_forward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, VocabSlice) {
  unimplemented(s, "embedding_forward");
}
void Kernels::embedding_backward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, VocabSlice) {
  unimplemented(s, "embedding_backward");
}
void Kernels::layernorm_forward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "layernorm_forward");
}
void Kernels::layernorm_backward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&) {
  unimplemented(s, "layernorm_backward");
}
void Kernels::residual_layernorm_forward(Stream& s, const Tensor& residual, const Tensor& out,
                                         const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                         const Tensor& b, const Tensor& w, const Tensor& bias) {
  residual_forward(s, residual, a, b);
  layernorm_forward(s, out, mean, rstd, residual, w, bias);
}
void Kernels::matmul_forward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&) {
  unimplemented(s, "matmul_forward");
}
void Kernels::matmul_backward(Stream& s, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, Accumulate) {
  unimplemented(s, "matmul_backward");
}
void Kernels::matmul_backward_weight(Stream& s, const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "matmul_backward_weight");
}
void Kernels::bias_backward(Stream& s, const Tensor&, const Tensor&) {
  unimplemented(s, "bias_backward");
}
void Kernels::matmul_gelu_forward(Stream& s, const Tensor& out, const Tensor& pre,
                                  const Tensor& inp, const Tensor& w, const Tensor& bias) {
  matmul_forward(s, pre, inp, w, bias);
  gelu_forward(s, out, pre);
}
void Kernels::matmul_backward_gelu(Stream& s, const Tensor& dpre, const Tensor& dpre_bias,
                                   const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                                   const Tensor& inp, const Tensor& w, const Tensor& pre) {
  matmul_backward(s, dpre, dw, dbias, dout, inp, w, Accumulate::kNo);
  gelu_backward(s, dpre, pre, dpre);
  if (dpre_bias.defined()) bias_backward(s, dpre_bias, dpre);
}
void Kernels::gelu_forward(Stream& s, const Tensor&, const Tensor&) {
  unimplemented(s, "gelu_forward");
}
void Kernels::gelu_backward(Stream& s, const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "gelu_backward");
}
void Kernels::flash_attention_forward(Stream& s, const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "flash_attention_forward");
}
void Kernels::flash_attention_backward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "flash_attention_backward");
}
void Kernels::flash_attention_cached(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, std::int64_t) {
  unimplemented(s, "flash_attention_cached");
}
void Kernels::attention_forward(Stream& s, const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "attention_forward");
}
void Kernels::attention_backward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&) {
  unimplemented(s, "attention_backward");
}
void Kernels::attention_cached(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, std::int64_t) {
  unimplemented(s, "attention_cached");
}
void Kernels::residual_forward(Stream& s, const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "residual_forward");
}
void Kernels::crossentropy_forward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, int) {
  unimplemented(s, "crossentropy_forward");
}
void Kernels::crossentropy_backward(Stream& s, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, float, int, VocabSlice) {
  unimplemented(s, "crossentropy_backward");
}
void Kernels::crossentropy_partial(Stream& s, const Tensor&, const Tensor&, const Tensor&, int,
                                   VocabSlice) {
  unimplemented(s, "crossentropy_partial");
}
void Kernels::crossentropy_combine(Stream& s, const Tensor&, const Tensor&, const Tensor&) {
  unimplemented(s, "crossentropy_combine");
}
void Kernels::squared_norm(Stream& s, const Tensor&, const Tensor&) {
  unimplemented(s, "squared_norm");
}
void Kernels::adamw_many(Stream& s, const std::vector<AdamWTensor>& tensors,
                         const AdamWArgs& args) {
  for (const AdamWTensor& t : tensors) {
    AdamWArgs a = args;
    a.weight_decay = t.weight_decay;
    adamw(s, t.p, t.g, t.m, t.v, a);
    if (t.compute.defined()) convert(s, t.compute, t.p);
  }
}
void Kernels::adamw(Stream& s, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const AdamWArgs&) {
  unimplemented(s, "adamw");
}
void Kernels::fill(Stream& s, const Tensor&, float) { unimplemented(s, "fill"); }
void Kernels::axpy(Stream& s, const Tensor&, float, const Tensor&) { unimplemented(s, "axpy"); }
void Kernels::convert(Stream& s, const Tensor&, const Tensor&) { unimplemented(s, "convert"); }
void Kernels::copy(Stream& s, const Tensor&, const Tensor&) { unimplemented(s, "copy"); }

}  // namespace troupe::gpu
