// The model a run trains: --model's preset, and --num-layers,
// --hidden-size, --num-attention-heads, --seq-length, --vocab-size,
// --make-vocab-size-divisible-by, --init-method-std over it.
#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"
#include "model/config.h"

namespace troupe::api {

absl::StatusOr<model::GptConfig> resolve_model(const TrainFlags& f) {
  absl::StatusOr<model::GptConfig> config = model::preset(f.model);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--model: ", config.status().message()));
  }
  if (f.layers) config->L = *f.layers;
  if (f.channels) config->C = *f.channels;
  if (f.heads) config->NH = *f.heads;
  if (f.seq_len) config->T = *f.seq_len;
  if (f.vocab_size) config->V = *f.vocab_size;
  if (f.vocab_multiple) config->vocab_multiple = *f.vocab_multiple;
  if (f.init_std) config->init_std = *f.init_std;
  return config;
}

}  // namespace troupe::api
