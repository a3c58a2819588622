// Megatron's zero-shot scoring (tasks/zeroshot_gpt/{datasets,evaluate}.py),
// one sequence per forward: the logits of every fed position, scored on the
// host in double.
#include "model/evaluation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace troupe::model {

double PerplexityResult::perplexity() const { return std::exp(loss()); }

double LambadaResult::accuracy() const {
  return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

double LambadaResult::mean_logprob() const {
  return total > 0 ? logprob_sum / static_cast<double>(total) : 0.0;
}

absl::StatusOr<PerplexityResult> perplexity(LanguageModel& lm, std::int64_t N, const IdReader& read,
                                            int stride) {
  const std::int64_t T = lm.context(), V = lm.vocab();
  if (stride < 1 || stride > T) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stride must be in [1, ", T, "] (the model's context), not ", stride));
  }
  if (N < 2) return absl::InvalidArgumentError("the text has fewer than 2 tokens to score");
  PerplexityResult r;
  std::vector<std::int32_t> window;
  // Window w: inputs ids[w*S, w*S + n), targets the ids one further; it
  // scores the targets from index `scored_from` of the window on.
  for (std::int64_t start = 0;; start += stride) {
    const std::int64_t n = std::min(T, N - 1 - start);
    const std::int64_t scored_from = start == 0 ? 0 : T - stride;
    window.resize(static_cast<std::size_t>(n + 1));
    if (absl::Status st = read(start, window); !st.ok()) return st;
    for (std::int32_t id : window) {
      if (id < 0 || id >= V) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the model's vocabulary [0, ", V, ")"));
      }
    }
    absl::StatusOr<std::span<const float>> logits = lm.forward(
        std::span<const std::int32_t>(window.data(), static_cast<std::size_t>(n)), 0, Logits::kAll);
    if (!logits.ok()) return logits.status();
    for (std::int64_t i = scored_from; i < n; i++) {
      const std::span<const float> row =
          logits->subspan(static_cast<std::size_t>(i * V), static_cast<std::size_t>(V));
      r.nll -= log_probability(row, window[static_cast<std::size_t>(i + 1)]);
      r.tokens++;
    }
    r.windows++;
    if (start + T >= N - 1) break;  // this window reached the last target
  }
  return r;
}

absl::StatusOr<PerplexityResult> perplexity(LanguageModel& lm, std::span<const std::int32_t> ids,
                                            int stride) {
  return perplexity(
      lm, static_cast<std::int64_t>(ids.size()),
      [ids](std::int64_t begin, std::span<std::int32_t> out) {
        std::copy_n(ids.begin() + begin, out.size(), out.begin());
        return absl::OkStatus();
      },
      stride);
}

absl::StatusOr<LambadaExample> lambada_example(data::BpeEncoder& encoder, absl::string_view text) {
  const absl::string_view stripped = absl::StripTrailingAsciiWhitespace(text);
  const std::size_t cut = stripped.find_last_of(" \t\n\r\f\v");
  if (cut == absl::string_view::npos ||
      absl::StripAsciiWhitespace(stripped.substr(0, cut)).empty()) {
    return absl::InvalidArgumentError("the text has no word before its last word");
  }
  LambadaExample ex;
  const absl::string_view context = absl::StripAsciiWhitespace(stripped.substr(0, cut));
  if (absl::Status st = encoder.encode(context, &ex.context); !st.ok()) return st;
  if (absl::Status st = encoder.encode(absl::StrCat(" ", stripped.substr(cut + 1)), &ex.target);
      !st.ok()) {
    return st;
  }
  if (ex.context.empty() || ex.target.empty()) {
    return absl::InvalidArgumentError("the context or the last word has no tokens");
  }
  return ex;
}

absl::StatusOr<LambadaResult> lambada(LanguageModel& lm, std::span<const LambadaExample> examples) {
  const std::size_t T = static_cast<std::size_t>(lm.context());
  const std::size_t V = static_cast<std::size_t>(lm.vocab());
  LambadaResult r;
  std::vector<std::int32_t> ids;
  for (const LambadaExample& ex : examples) {
    ids = ex.context;
    ids.insert(ids.end(), ex.target.begin(), ex.target.end());
    if (ex.context.empty() || ex.target.empty()) {
      return absl::InvalidArgumentError("a LAMBADA example has no context or no target");
    }
    if (ex.target.size() > T) {
      return absl::InvalidArgumentError(absl::StrCat("a target of ", ex.target.size(),
                                                     " tokens does not fit the context of ", T));
    }
    if (ids.size() > T + 1) ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(T + 1));
    // Feed all but the last id; the targets are the last target.size() ids,
    // predicted at the positions just before them.
    const std::size_t n = ids.size() - 1, first = n - ex.target.size();
    absl::StatusOr<std::span<const float>> logits =
        lm.forward(std::span<const std::int32_t>(ids.data(), n), 0, Logits::kAll);
    if (!logits.ok()) return logits.status();
    bool correct = true;
    for (std::size_t i = first; i < n; i++) {
      const std::span<const float> row = logits->subspan(i * V, V);
      const std::int32_t want = ids[i + 1];
      correct = correct && argmax(row) == want;
      r.logprob_sum += log_probability(row, want);
    }
    r.correct += correct ? 1 : 0;
    r.total++;
  }
  return r;
}

}  // namespace troupe::model
