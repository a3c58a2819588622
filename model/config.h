// GPT model configurations: presets by name and the derived dimensions.
//
//   absl::StatusOr<GptConfig> c = model::preset("gpt2-124m");
//   c->L = 6;                      // a flag overrides any dimension
//   absl::Status st = c->validate();
//   int Vp = c->Vp();              // vocabulary padded for the LM head
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/device.h"
#include "gpu/precision.h"

namespace troupe::model {

struct GptConfig {
  std::string name;
  int L = 0;   // layers
  int C = 0;   // channels
  int NH = 0;  // heads
  int T = 0;   // maximum sequence length (rows of wpe)
  int V = 0;   // vocabulary size
  // The LM head's rows are padded to a multiple of this (Megatron's
  // --make-vocab-size-divisible-by). Results never depend on the padding.
  int vocab_multiple = 128;
  // Weights are drawn from N(0, init_std), the residual projections from
  // N(0, init_std / sqrt(2L)) (GPT-2; Megatron's --init-method-std). Not a
  // dimension: checkpoints and weight files do not depend on it.
  double init_std = 0.02;

  int HS() const { return C / NH; }
  int Vp() const { return (V + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  // Parameters of the model, the tied embedding once, padding excluded.
  std::int64_t num_parameters() const;
  // Training FLOPs per token (forward + backward): 6 * matmul parameters
  // (LM head included) plus the attention score and value products.
  double flops_per_token(int seq_len) const;

  // InvalidArgument naming the dimension when one is out of range or C is not
  // a multiple of NH.
  absl::Status validate() const;
  std::string describe() const;
};

// What a model chunk keeps between a micro-batch's forward and its backward
// (Megatron's --recompute-granularity, --recompute-method,
// --recompute-num-layers; Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models"):
//   none       every activation the backward reads is kept
//   selective  the attention scores and softmax (B·NH·T² a layer) are not
//              kept; the backward recomputes them from the kept q, k, v
//   full       a group of layers keeps only its input and recomputes the
//              group's forward in the backward. uniform: groups of N layers
//              (the last may be shorter); block: the first N layers of the
//              chunk, each its own group, the rest keep everything.
// Results are bitwise the same in every mode: the recompute runs the same
// kernels on the same stream.
enum class Recompute { kNone, kSelective, kFull };
enum class RecomputeMethod { kUniform, kBlock };

// --attention-kernel: which kernel family computes causal self-attention
// (gpu/kernels.h).
//   flash      tiles with an online softmax; a layer keeps its q, k, v, its
//              output and each query row's log-sum-exp (B·NH·T floats):
//              memory linear in T, and selective recompute has nothing left
//              to recompute (as Megatron says of flash attention)
//   reference  the softmax probabilities materialised, B·NH·T² a layer
// Both are deterministic; they differ in the order of their sums (within
// ~1e-6 relative in fp32). kDefault: the device's, resolved where the
// device is known (model::Gpt, model::Decoder; api's flags for the banner):
// flash, but reference on CUDA until cuda_flash_verified().
enum class AttentionKernel { kDefault, kFlash, kReference };
absl::StatusOr<AttentionKernel> parse_attention_kernel(absl::string_view name);
std::string attention_kernel_name(AttentionKernel k);
// Whether the CUDA flash kernels have passed scripts/gpu-check's op suite on
// a GPU (docs/CUDA.md): until then CUDA's default is the reference kernel.
bool cuda_flash_verified();
// `k`, or for kDefault the kernel a device of `kind` takes.
AttentionKernel resolve_attention_kernel(AttentionKernel k, gpu::DeviceKind kind);

struct ActivationOptions {
  Recompute recompute = Recompute::kNone;
  RecomputeMethod method = RecomputeMethod::kUniform;  // kFull only
  int recompute_layers = 1;                            // kFull only: N
  // --sequence-parallel (Korthikanti et al. 2022; tp > 1): the LayerNorm
  // and residual regions hold 1/tp of the micro-batch's B*T token rows each
  // (contiguous rows of the (B, T, C) activations: the same split of
  // per-token work as Megatron's sequence split of its (T, B, C) ones); the
  // TP all-reduces around them become all-gathers before and
  // reduce-scatters after, and their LayerNorm weights sum their gradients
  // over the TP group.
  bool sequence_parallel = false;
  // --bf16, --fp16: the activations, their gradients and the parameters'
  // compute copy (from the optimizer's fp32 master) are tensors in this
  // precision (gpu::compute_dtype); parameter gradients, their reduction,
  // the loss and the LayerNorm statistics stay fp32 (as Megatron's mixed
  // precision). gpu/kernels.h has each op's dtypes.
  gpu::Precision precision = gpu::Precision::kFp32;
  // --attention-kernel; kDefault: the device's (resolve_attention_kernel).
  // Memory counts without a device (counted_slot_bytes) take kDefault as
  // flash.
  AttentionKernel attention = AttentionKernel::kDefault;
  // Whether selective recompute has anything to recompute: the reference
  // kernel's probabilities. With flash attention it keeps everything.
  bool recomputes_scores() const {
    return recompute == Recompute::kSelective && attention == AttentionKernel::kReference;
  }
  // InvalidArgument naming the flag.
  absl::Status validate() const;
  // "none", "selective", "full (uniform, 1 layer a group)", ...
  std::string describe() const;
};

// --recompute-granularity, --recompute-method: InvalidArgument naming the
// flag and the choices.
absl::StatusOr<Recompute> parse_recompute_granularity(absl::string_view name);
absl::StatusOr<RecomputeMethod> parse_recompute_method(absl::string_view name);
std::string recompute_name(Recompute r);
std::string recompute_method_name(RecomputeMethod m);

// A preset by name: tiny, cpu-small, gpt2-124m, gpt2-350m, gpt3-1.3b,
// gpt3-175b, mt-nlg-530b. NotFound lists the known names.
absl::StatusOr<GptConfig> preset(absl::string_view name);
std::vector<std::string> preset_names();

}  // namespace troupe::model
