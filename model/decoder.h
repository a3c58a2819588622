// GPT for generation and evaluation: a stage's tensor-parallel shard of the
// model with a KV cache, fed a prompt and then one position at a time, so
// each new token costs one position's work, not the whole prefix's.
//
// The same parameters (ParamLayout::gpt of the stage and slice, so weights
// and checkpoints fill it as they fill a Gpt) and the same ops as Gpt's
// forward, with attention_cached in place of attention_forward; no
// gradients, no sequence parallelism. In a 16-bit compute dtype (bf16 or
// fp16, Megatron's inference in the trained precision) the parameters, the
// KV cache, the activations and the logits are in it; the LayerNorm
// statistics fp32.
//
//   model::Decoder dec(config, gpu::cpu_device(), StageSpec::whole(config));
//   RETURN_IF_ERROR(load_weights_slice(path, config, dec.layout(), host));  // then copy in
//   dec.forward(stream, prompt, n, /*pos=*/0, Logits::kLast);  // prompt: i32 (B, n)
//   dec.forward(stream, next, 1, /*pos=*/n, Logits::kLast);    // next: i32 (B, 1)
//   // dec.logits(): (B, 1, Vl), this rank's vocabulary slice
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/device.h"
#include "gpu/tensor.h"
#include "model/config.h"
#include "model/gpt.h"
#include "model/layout.h"

namespace troupe::model {

// Which positions of a forward the head makes logits for: the last (the
// next token's distribution) or all n (scoring a text).
enum class Logits { kLast, kAll };

class Decoder {
 public:
  // Parameters, B sequences' KV caches of config.T positions and the
  // buffers of a forward of up to T positions, on `device`, in `dtype` (a
  // compute dtype: f32, bf16 or f16). With flash attention (kDefault: the
  // device's, resolve_attention_kernel) nothing is T x T;
  // the reference kernel keeps a (B, NH, T, T) scratch for its scores.
  Decoder(const GptConfig& config, gpu::Device& device, const StageSpec& stage,
          TensorParallel tp = {}, int B = 1, gpu::DType dtype = gpu::DType::kF32,
          AttentionKernel attention = AttentionKernel::kDefault);

  const GptConfig& config() const { return config_; }
  const StageSpec& stage() const { return stage_; }
  const ParamLayout& layout() const { return layout_; }
  // layout().total() values of dtype(); fill before the first forward
  // (gpu::copy_values_to_device rounds fp32 values into it).
  const gpu::Tensor& params() const { return params_flat_; }
  int B() const { return B_; }
  gpu::DType dtype() const { return params_flat_.dtype; }

  // Positions pos..pos+n-1 of the B sequences: the embedding stage reads
  // tokens i32 (B, n), the others input(n), which the caller filled with
  // the previous stage's output() (`tokens` is then unused). Their k and v
  // join the cache; positions from pos on that an earlier forward cached
  // are overwritten (a new prompt starts at 0). Positions outside
  // [0, T) are an error on the stream.
  void forward(gpu::Stream& s, const gpu::Tensor& tokens, std::int64_t n, std::int64_t pos,
               Logits which = Logits::kLast);
  // (B, n, C): where a stage without the embedding reads its input.
  gpu::Tensor input(std::int64_t n) const;

  // (B, n, C): the last forward's output, what the next stage reads.
  gpu::Tensor output() const;
  // (B, rows, Vl): the head's logits of this rank's vocabulary slice, rows
  // 1 (kLast) or n (kAll). Vl = Vp / tp; columns past V are padding.
  gpu::Tensor logits() const;
  // (tp, B, rows, Vl): every TP rank's logits(), gathered over the TP group
  // (tp > 1 only; logits() itself when tp = 1).
  gpu::Tensor gathered_logits(gpu::Stream& s);

 private:
  void layer_forward(gpu::Stream& s, int l, std::int64_t pos, std::int64_t n);
  void all_reduce(gpu::Stream& s, const gpu::Tensor& x);
  gpu::VocabSlice vocab_slice() const;
  // The first n positions of a (B, T, cols) buffer, as (B, n, cols).
  static gpu::Tensor first(const gpu::Tensor& buf, std::int64_t n);

  GptConfig config_;
  StageSpec stage_;
  TensorParallel tp_;
  int B_;
  ParamLayout layout_;
  gpu::Tensor params_flat_;
  GptParams p_;
  std::vector<gpu::Tensor> kcache_, vcache_;  // per layer: (B, NHl, T, HS)
  // A forward's buffers, for up to T positions (views of their first n).
  gpu::Tensor h_;               // (B, T, C): the residual stream, each layer's output
  gpu::Tensor res2_;            // (B, T, C): after the attention branch
  gpu::Tensor ln_;              // (B, T, C)
  gpu::Tensor mean_, rstd_;     // (B, T)
  gpu::Tensor qkv_;             // (B, T, 3Cl)
  gpu::Tensor att_;             // (B, NHl, T, T): the reference kernel's only
  gpu::Tensor atty_;            // (B, T, Cl)
  gpu::Tensor proj_;            // (B, T, C): the row-parallel projections' partial sums
  gpu::Tensor fch_, fch_gelu_;  // (B, T, 4Cl)
  gpu::Tensor logits_;          // (B, T, Vl)
  gpu::Tensor gathered_;        // (tp, B, T, Vl) when tp > 1
  gpu::Tensor zero_wpe_;        // (T, C) zeros: TP ranks t > 0 add wpe through rank 0
  std::int64_t n_ = 0;          // positions of the last forward
  Logits which_ = Logits::kLast;
};

}  // namespace troupe::model
