// Text generation on any language model that scores one sequence's
// positions: Megatron's sampling (greedy, temperature, top-k, top-p) with
// one seeded generator on the host, and the loop that feeds each new token
// back through the KV cache.
//
//   model::GenerateOptions o{.max_new_tokens = 32, .sampling = {.top_k = 40, .seed = 7}};
//   absl::StatusOr<model::Generated> g = model::generate(lm, prompt_ids, o);
//   // g->tokens: the new ids (the <|endoftext|> that stopped it included)
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/decoder.h"

namespace troupe::model {

// One sequence at a time: the model keeps the positions it was fed (a KV
// cache), and forward() feeds more of them.
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual int context() const = 0;  // T: positions a sequence may have
  virtual int vocab() const = 0;    // V: real ids (logits past V are padding, never returned)
  // Feeds `tokens` at positions pos.. (positions from pos on that were fed
  // before are replaced; pos = 0 starts a new sequence). Returns the logits
  // over the V real ids: of the last fed position (kLast) or of every fed
  // position, row-major (kAll). Valid until the next call.
  virtual absl::StatusOr<std::span<const float>> forward(std::span<const std::int32_t> tokens,
                                                         std::int64_t pos, Logits which) = 0;
};

// Megatron's sampling arguments (--temperature, --top-k, --top-p) and a
// seed. top_k == 1 or temperature == 0 is greedy (argmax, lowest id on a
// tie); top_k > 1 keeps the k most likely (exactly k: the lower ids of a
// tie at the k-th value; Megatron keeps the whole tie); top_p > 0 keeps the most likely
// ids until their probability reaches top_p (the one crossing it
// included); both may not be set.
struct SamplingOptions {
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 0.0;
  std::uint64_t seed = 1234;
  bool greedy() const { return top_k == 1 || temperature == 0.0; }
  // InvalidArgument naming the flag (`prefix` + "temperature", ...).
  absl::Status validate(const std::string& prefix = "--") const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) {}
  // The next id from logits over V ids; draws one number from the
  // generator unless greedy.
  std::int32_t next(std::span<const float> logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<double, std::int32_t>> kept_;  // (probability, id), scratch
};

// log softmax(logits)[id], in double.
double log_probability(std::span<const float> logits, std::int32_t id);
// The argmax, lowest id on a tie.
std::int32_t argmax(std::span<const float> logits);

struct GenerateOptions {
  int max_new_tokens = 64;
  SamplingOptions sampling;
  std::int32_t eod = 50256;  // <|endoftext|>: generation stops after it
  // false: every step feeds the whole sequence from position 0 again (the
  // cost a KV cache saves; for benchmarks and tests).
  bool use_cache = true;
  // Also the log probabilities: of each new id, and of each prompt id
  // after the first (the prompt's forward then makes the logits of every
  // position). Off, a step costs no log softmax over the vocabulary.
  bool logprobs = false;
};

struct Generated {
  std::vector<std::int32_t> tokens;  // the new ids; ends with eod when it stopped there
  // With GenerateOptions::logprobs: each new id's log probability (of the
  // model's distribution, before sampling's changes), and the prompt's ids 1..
  std::vector<double> logprobs;
  std::vector<double> prompt_logprobs;
  bool stopped_at_eod = false;
};

// Step callback: the step's logits (V floats) and the id chosen.
using StepObserver = std::function<void(std::span<const float> logits, std::int32_t id)>;

// The prompt (at least one id) and max_new_tokens ids after it (0: only
// the prompt's scores, with logprobs); an InvalidArgument when they
// need more than the model's context.
absl::StatusOr<Generated> generate(LanguageModel& lm, std::span<const std::int32_t> prompt,
                                   const GenerateOptions& o, const StepObserver& observe = {});

}  // namespace troupe::model
