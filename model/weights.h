// GPT weights in the ecosystem's format: safetensors with Hugging Face GPT-2
// names and layouts (Conv1D weights as (in, out); wte with V rows; the model's
// n_layer, n_embd, n_head, vocab_size and n_ctx in __metadata__).
//
//   RETURN_IF_ERROR(model::save_weights(gpt, "out.safetensors"));
//   RETURN_IF_ERROR(model::load_weights("gpt2.safetensors", gpt));
//
// Reading also accepts the "transformer." prefix, wte with Vp rows, an
// lm_head.weight equal to wte.weight, and ignores the h.{i}.attn.bias and
// .masked_bias buffers. Metadata that disagrees with the model's config, a
// missing or unexpected tensor, a wrong shape or dtype, or a truncated file
// is an error naming the file and the tensor.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "model/gpt.h"

namespace troupe::model {

absl::Status save_weights(const Gpt& gpt, const std::string& path);
absl::Status load_weights(const std::string& path, Gpt& gpt);
// The tensors of `layout` (a stage's TP slice of `config`'s model, e.g. one
// rank's chunk) into `params` (layout.total() floats, host memory), reading
// from the file only the tensors the slice holds. The same checks and
// errors as load_weights.
absl::Status load_weights_slice(const std::string& path, const GptConfig& config,
                                const ParamLayout& layout, float* params);

// The model a weights file holds: `base` (a preset) with the file's
// metadata (n_layer, n_embd, n_head, vocab_size, n_ctx, as save_weights
// writes them) in place of its own. Files from elsewhere may lack them.
absl::StatusOr<GptConfig> weights_config(const std::string& path, const GptConfig& base);

}  // namespace troupe::model
