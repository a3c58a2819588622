// The op table a backend implements. Callers use gpu/ops.h, which checks
// shapes, dtypes and devices and then dispatches here; implementations may
// assume their arguments are valid, contiguous and on their device. Every op
// is enqueued on `s` and runs asynchronously.
//
// Dtypes (Megatron's mixed precision): an op's activations, their
// gradients and the parameters it reads share one compute dtype A (f32,
// bf16 or f16: the dtype of its activation input, or of wte for the
// embedding); parameter gradients (dw, db,
// dbias, dwte, dwpe: the fp32 main gradients, accumulated into), LayerNorm
// statistics, the loss, log-sum-exp and cross-entropy statistics are f32;
// AdamW and the squared norm work on f32; tokens and targets are i32. A
// kernel reads A, computes in fp32 in registers and writes A rounded to
// nearest even (gpu/precision.h).
//
// Shapes use the model's names: N = rows (B*T), C channels, OC/IC output and
// input channels of a linear layer, NH heads, HS = C/NH, Vp padded vocab of
// which the first V columns are real.
//
// Defaults: a method a backend does not override records Unimplemented on
// the stream ("<op> is not implemented on <device>"), except the fused ops
// (matmul_gelu_forward, matmul_backward_gelu, residual_layernorm_forward),
// which run the unfused ops.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"
#include "gpu/device.h"
#include "gpu/precision.h"
#include "gpu/tensor.h"

namespace troupe::gpu {

// Whether an op overwrites its output or adds to it (gradient accumulation).
enum class Accumulate { kNo, kYes };

struct AdamWArgs {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;
  int step = 1;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // clip factor applied to the gradient first
};

// One tensor of a multi-tensor AdamW step: parameters, gradient and moments
// of one shape, and the tensor's own weight decay. `compute`, when defined,
// receives the updated p rounded to its dtype (the bf16/f16 compute copy
// of an fp32 master), written as the step goes.
struct AdamWTensor {
  Tensor p, g, m, v;
  float weight_decay = 0;
  Tensor compute;
};

// The rows [begin, begin + rows) of a vocabulary of `total` ids that one
// tensor-parallel rank holds (Megatron's vocab-parallel embedding and
// cross-entropy); ids outside the slice are another rank's. The default is
// the whole vocabulary (total = the tensor's rows).
struct VocabSlice {
  std::int64_t begin = 0;
  std::int64_t total = -1;  // ids must be in [0, total); -1: the tensor's rows
  bool whole() const { return begin == 0 && total < 0; }
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // out[B,T,C] = wte[tokens[b,t]] + wpe[t]; with a slice, a token outside it
  // contributes 0 (wte[token - begin] inside).
  virtual void embedding_forward(Stream& s, const Tensor& out, const Tensor& tokens,
                                 const Tensor& wte, const Tensor& wpe, VocabSlice slice);
  // dwte[tokens[b,t]] += dout[b,t] (tokens in the slice); dwpe[t] += dout[b,t]
  // (fixed order)
  virtual void embedding_backward(Stream& s, const Tensor& dwte, const Tensor& dwpe,
                                  const Tensor& dout, const Tensor& tokens, VocabSlice slice);

  // out[N,C] = (inp - mean) * rstd * w + b; saves mean[N], rstd[N].
  virtual void layernorm_forward(Stream& s, const Tensor& out, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& inp, const Tensor& w,
                                 const Tensor& b);
  // dinp += ..., dw += ..., db += ...
  virtual void layernorm_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                                  const Tensor& dout, const Tensor& inp, const Tensor& w,
                                  const Tensor& mean, const Tensor& rstd);

  // The residual connection and the LayerNorm after it, fused (one pass
  // over the rows, a and b read once): residual = a + b, then
  // layernorm_forward(out, mean, rstd, residual, w, bias) of the rounded
  // sum, bitwise as the unfused pair computes it. The default runs
  // residual_forward, then layernorm_forward.
  virtual void residual_layernorm_forward(Stream& s, const Tensor& residual, const Tensor& out,
                                          const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                          const Tensor& b, const Tensor& w, const Tensor& bias);

  // out[N,OC] = inp[N,IC] . w[OC,IC]^T + bias[OC]  (bias may be undefined)
  virtual void matmul_forward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& w,
                              const Tensor& bias);
  // dinp (=|+=) dout . w;  dw += dout^T . inp;  dbias += colsum(dout).
  // dw (and dbias) may be undefined: the input gradient alone, with the
  // weight's gradient left to matmul_backward_weight (a pipeline's B and W).
  virtual void matmul_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& dbias,
                               const Tensor& dout, const Tensor& inp, const Tensor& w,
                               Accumulate dinp_mode);
  // dw[OC,IC] += dout[N,OC]^T . inp[N,IC]: the weight gradient alone, the
  // same GEMM matmul_backward runs for it (bitwise the same sum).
  virtual void matmul_backward_weight(Stream& s, const Tensor& dw, const Tensor& dout,
                                      const Tensor& inp);

  // dbias[OC] += colsum(dout[N, OC]), rows in a fixed order: a bias's
  // gradient on its own (matmul_backward makes it beside the GEMMs).
  virtual void bias_backward(Stream& s, const Tensor& dbias, const Tensor& dout);

  // The MLP's first linear layer with its GELU (Megatron's fc1):
  // pre[N,OC] = inp . w^T + bias, kept for the backward; out = gelu(pre).
  // CUDA fuses the GELU and the bias into the GEMM (cuBLASLt's
  // GELU_AUX_BIAS epilogue: pre is its aux output); the default runs
  // matmul_forward, then gelu_forward.
  virtual void matmul_gelu_forward(Stream& s, const Tensor& out, const Tensor& pre,
                                   const Tensor& inp, const Tensor& w, const Tensor& bias);
  // The backward of the linear layer that reads inp = gelu(pre) (fc2):
  // dpre = gelu'(pre) * (dout . w) (overwrites); dpre_bias += colsum(dpre)
  // (fc1's bias gradient, may be undefined); dw += dout^T . inp; dbias +=
  // colsum(dout). CUDA fuses GELU's derivative into the input-gradient
  // GEMM (cuBLASLt's DGELU epilogue; dpre_bias is bias_backward's fp32 sum);
  // the default runs matmul_backward, gelu_backward and bias_backward.
  // dpre may not be any of the inputs; dw may be undefined (as in
  // matmul_backward).
  virtual void matmul_backward_gelu(Stream& s, const Tensor& dpre, const Tensor& dpre_bias,
                                    const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                                    const Tensor& inp, const Tensor& w, const Tensor& pre);

  // GPT-2's tanh approximation of GELU.
  virtual void gelu_forward(Stream& s, const Tensor& out, const Tensor& inp);
  // dinp = gelu'(inp) * dout
  virtual void gelu_backward(Stream& s, const Tensor& dinp, const Tensor& inp, const Tensor& dout);

  // Causal self-attention, two kernel families (the model picks one,
  // model::AttentionKernel). qkv[B,T,3C] holds q, k, v (each NH heads of
  // HS); out[B,T,C] the heads' outputs side by side.
  //
  // Flash: tiles of q against tiles of k, v with an online softmax; lse[B,NH,T]
  // (f32) keeps each query row's log-sum-exp of its scaled scores for the
  // backward, nothing T x T. Deterministic (no atomics; fixed summation
  // orders).
  virtual void flash_attention_forward(Stream& s, const Tensor& out, const Tensor& lse,
                                       const Tensor& qkv);
  // dqkv = ... (overwrites) from dout, the forward's qkv, out and lse;
  // delta[B,NH,T] (f32) is scratch (rowsum(dout * out)).
  virtual void flash_attention_backward(Stream& s, const Tensor& dqkv, const Tensor& delta,
                                        const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                        const Tensor& lse);
  // attention_cached's step (below) in the flash family: no probabilities'
  // scratch.
  virtual void flash_attention_cached(Stream& s, const Tensor& out, const Tensor& kcache,
                                      const Tensor& vcache, const Tensor& qkv, std::int64_t pos);

  // Reference: att[B,NH,T,T] keeps the softmax probabilities for the
  // backward (memory quadratic in T).
  virtual void attention_forward(Stream& s, const Tensor& out, const Tensor& att,
                                 const Tensor& qkv);
  // dqkv = ...  (overwrites); datt is scratch of att's shape.
  virtual void attention_backward(Stream& s, const Tensor& dqkv, const Tensor& datt,
                                  const Tensor& dout, const Tensor& qkv, const Tensor& att);
  // Incremental (KV-cached) causal attention for generation: qkv[B,n,3C]
  // holds q, k, v of the n positions pos..pos+n-1; their k and v are written
  // into kcache, vcache[B,NH,Tc,HS] at rows pos..pos+n-1, then query i
  // attends to the cached rows 0..pos+i. att[B,NH,n,Tc] is scratch for the
  // probabilities (zeros after pos+i); out[B,n,C] as attention_forward's.
  virtual void attention_cached(Stream& s, const Tensor& out, const Tensor& att,
                                const Tensor& kcache, const Tensor& vcache, const Tensor& qkv,
                                std::int64_t pos);

  // out = a + b
  virtual void residual_forward(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b);

  // losses[N] = logsumexp(logits[n, :V]) - logits[n, targets[n]]; lse[N] kept
  // for the backward. Columns V..Vp-1 (vocabulary padding) are ignored.
  virtual void crossentropy_forward(Stream& s, const Tensor& losses, const Tensor& lse,
                                    const Tensor& logits, const Tensor& targets, int V);
  // dlogits[n, j] = (softmax(logits[n, :V])_j - [j == targets[n]]) * dloss for
  // j < V, 0 for the padding. dlogits may alias logits. With a slice, column j
  // is vocabulary id begin + j and lse is over the whole vocabulary.
  virtual void crossentropy_backward(Stream& s, const Tensor& dlogits, const Tensor& logits,
                                     const Tensor& lse, const Tensor& targets, float dloss, int V,
                                     VocabSlice slice);
  // Vocab-parallel cross-entropy, step 1 on each rank's slice of the logits:
  // stats[N, 3] = (max, sum of exp(x - max), the target's logit or 0) over
  // the slice's ids below V.
  virtual void crossentropy_partial(Stream& s, const Tensor& stats, const Tensor& logits,
                                    const Tensor& targets, int V, VocabSlice slice);
  // Step 2, once every rank's stats are gathered as stats[P, N, 3]:
  // lse[n] = logsumexp over all slices, losses[n] = lse[n] - target logit.
  virtual void crossentropy_combine(Stream& s, const Tensor& losses, const Tensor& lse,
                                    const Tensor& stats);

  // out[0] (f64) = sum of x^2, summed in a fixed order.
  virtual void squared_norm(Stream& s, const Tensor& out, const Tensor& x);
  // AdamW with decoupled weight decay: p, m, v updated in place from g.
  virtual void adamw(Stream& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                     const AdamWArgs& args);
  // adamw on each tensor, with its own weight decay (args.weight_decay is
  // not used), and the compute copies: one launch for many tensors on CUDA.
  // The default calls adamw per tensor, in order, then convert into its
  // copy; the CPU backend does the same loop as one stream task (bitwise
  // the same).
  virtual void adamw_many(Stream& s, const std::vector<AdamWTensor>& tensors,
                          const AdamWArgs& args);
  // x[:] = value
  virtual void fill(Stream& s, const Tensor& x, float value);
  // y += alpha * x
  virtual void axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x);
  // out = in in out's dtype (f32, bf16, f16), rounded to nearest even.
  virtual void convert(Stream& s, const Tensor& out, const Tensor& in);
  // dst = src, bytes of equal size, each in the device's memory or host
  // memory of it (Storage::host): how data moves between host and device.
  virtual void copy(Stream& s, const Tensor& dst, const Tensor& src);

 protected:
  void unimplemented(Stream& s, absl::string_view op);
};

}  // namespace troupe::gpu
