// Zero-shot evaluation as Megatron's tasks/zeroshot_gpt does it, on any
// LanguageModel: perplexity over a token stream in overlapping windows, and
// strict LAMBADA (the last word of a passage from the text before it).
//
//   absl::StatusOr<model::PerplexityResult> p = model::perplexity(lm, ids, /*stride=*/512);
//   absl::StatusOr<model::LambadaExample> ex = model::lambada_example(encoder, text);
//   absl::StatusOr<model::LambadaResult> r = model::lambada(lm, examples);
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/data/bpe.h"
#include "model/generation.h"

namespace troupe::model {

// perplexity() is not clamped (Megatron reports exp(min(20, loss))); a
// loss past 709 nats makes it inf.
struct PerplexityResult {
  std::int64_t tokens = 0;  // targets scored: every id after the first, once
  double nll = 0;           // their summed negative log-likelihood (nats)
  std::int64_t windows = 0;
  double loss() const { return tokens > 0 ? nll / static_cast<double>(tokens) : 0.0; }
  double perplexity() const;  // exp(loss)
};

// Megatron's overlapping evaluation: window w feeds the T ids from w*S and
// scores the next id at each position; the first window scores all of its
// targets, every later one only its last S, so each id after the first is
// scored once with at least T - S ids of context. 1 <= S <= T.
absl::StatusOr<PerplexityResult> perplexity(LanguageModel& lm, std::span<const std::int32_t> ids,
                                            int stride);
// The same over a stream of N ids read a window at a time: `read` fills
// `out` with ids [begin, begin + out.size()). Ids outside [0, V) are
// InvalidArgument.
using IdReader = std::function<absl::Status(std::int64_t begin, std::span<std::int32_t> out)>;
absl::StatusOr<PerplexityResult> perplexity(LanguageModel& lm, std::int64_t N, const IdReader& read,
                                            int stride);

// Strict LAMBADA: the target is the passage's last whitespace-separated
// word, the context the text before it with surrounding whitespace
// stripped, the target ids the BPE of ' ' + word. (Whitespace is ASCII's;
// Megatron's Python split() also splits at Unicode spaces.)
struct LambadaExample {
  std::vector<std::int32_t> context, target;
};
absl::StatusOr<LambadaExample> lambada_example(data::BpeEncoder& encoder, absl::string_view text);

struct LambadaResult {
  std::int64_t correct = 0, total = 0;
  double logprob_sum = 0;  // of every example's target (the sum of its ids' log probabilities)
  double accuracy() const;
  double mean_logprob() const;  // per example
};

// An example is correct when each target id is the argmax given the
// context and the target ids before it (one forward of context + target
// but its last id). An example longer than the model's context keeps its
// last T + 1 ids (the context is cut from the left).
absl::StatusOr<LambadaResult> lambada(LanguageModel& lm, std::span<const LambadaExample> examples);

}  // namespace troupe::model
