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

// A preset by name: tiny, cpu-small, gpt2-124m, gpt2-350m, gpt3-1.3b,
// gpt3-175b, mt-nlg-530b. NotFound lists the known names.
absl::StatusOr<GptConfig> preset(absl::string_view name);
std::vector<std::string> preset_names();

}  // namespace troupe::model
