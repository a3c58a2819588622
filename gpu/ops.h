// The public op API: check arguments, then dispatch to the stream's backend.
//
// Each call validates shapes, dtypes and devices, names itself in the error
// ("layernorm_forward: w is f32[63], want f32[64]"), and enqueues the op on
// `s`. A failed check records the error on the stream (sticky, returned by
// Stream::synchronize) and enqueues nothing. See gpu/kernels.h for what each
// op computes.
#pragma once

#include "gpu/kernels.h"

namespace troupe::gpu::ops {

void embedding_forward(Stream& s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, VocabSlice slice = {});
void embedding_backward(Stream& s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, VocabSlice slice = {});
void layernorm_forward(Stream& s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& inp, const Tensor& w, const Tensor& b);
void layernorm_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                        const Tensor& dout, const Tensor& inp, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd);
void residual_layernorm_forward(Stream& s, const Tensor& residual, const Tensor& out,
                                const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                const Tensor& b, const Tensor& w, const Tensor& bias);
void matmul_forward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& w,
                    const Tensor& bias);
void matmul_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& dbias,
                     const Tensor& dout, const Tensor& inp, const Tensor& w, Accumulate dinp_mode);
void matmul_backward_weight(Stream& s, const Tensor& dw, const Tensor& dout, const Tensor& inp);
void bias_backward(Stream& s, const Tensor& dbias, const Tensor& dout);
void matmul_gelu_forward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& inp,
                         const Tensor& w, const Tensor& bias);
void matmul_backward_gelu(Stream& s, const Tensor& dpre, const Tensor& dpre_bias, const Tensor& dw,
                          const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& w, const Tensor& pre);
void gelu_forward(Stream& s, const Tensor& out, const Tensor& inp);
void gelu_backward(Stream& s, const Tensor& dinp, const Tensor& inp, const Tensor& dout);
void flash_attention_forward(Stream& s, const Tensor& out, const Tensor& lse, const Tensor& qkv);
void flash_attention_backward(Stream& s, const Tensor& dqkv, const Tensor& delta,
                              const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse);
void flash_attention_cached(Stream& s, const Tensor& out, const Tensor& kcache,
                            const Tensor& vcache, const Tensor& qkv, std::int64_t pos);
void attention_forward(Stream& s, const Tensor& out, const Tensor& att, const Tensor& qkv);
void attention_backward(Stream& s, const Tensor& dqkv, const Tensor& datt, const Tensor& dout,
                        const Tensor& qkv, const Tensor& att);
void attention_cached(Stream& s, const Tensor& out, const Tensor& att, const Tensor& kcache,
                      const Tensor& vcache, const Tensor& qkv, std::int64_t pos);
void residual_forward(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b);
void crossentropy_forward(Stream& s, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                          const Tensor& targets, int V);
void crossentropy_backward(Stream& s, const Tensor& dlogits, const Tensor& logits,
                           const Tensor& lse, const Tensor& targets, float dloss, int V,
                           VocabSlice slice = {});
void crossentropy_partial(Stream& s, const Tensor& stats, const Tensor& logits,
                          const Tensor& targets, int V, VocabSlice slice);
void crossentropy_combine(Stream& s, const Tensor& losses, const Tensor& lse, const Tensor& stats);
void squared_norm(Stream& s, const Tensor& out, const Tensor& x);
void adamw(Stream& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
           const AdamWArgs& args);
void adamw_many(Stream& s, const std::vector<AdamWTensor>& tensors, const AdamWArgs& args);
void fill(Stream& s, const Tensor& x, float value);
void axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x);
// out = in converted to out's dtype, rounded to nearest even (fp32 master
// weights to their bf16 compute copy, and back); out may be in when the
// dtypes are equal, else they must not overlap.
void convert(Stream& s, const Tensor& out, const Tensor& in);
// dst = src in stream order: same dtype and element count, each contiguous
// and either `s`'s device's memory or host memory of it (Tensor::
// empty_host). The one way data moves between host and device in a step:
//   ops::copy(s, host_losses, losses);  s.synchronize();  host_losses.host<float>()
void copy(Stream& s, const Tensor& dst, const Tensor& src);

}  // namespace troupe::gpu::ops
