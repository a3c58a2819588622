// Sampling as Megatron's text generation does it (its sampling.py): greedy
// for top-k 1, else the logits divided by the temperature, filtered by top-k
// or top-p, softmaxed and sampled; here in double on the host, from one
// std::mt19937_64 draw per token by the inverse of the kept ids' CDF.
#include "model/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace troupe::model {

absl::Status SamplingOptions::validate(const std::string& prefix) const {
  if (!(temperature >= 0.0 && temperature <= 100.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "temperature must be in [0, 100] (0: greedy), not ", temperature));
  }
  if (top_k < 0 || top_k > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "top-k must be in [0, 1000] (0: off, 1: greedy), not ", top_k));
  }
  if (!(top_p >= 0.0 && top_p <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "top-p must be in [0, 1] (0: off), not ", top_p));
  }
  if (top_k > 1 && top_p > 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot set both ", prefix, "top-k and ", prefix, "top-p"));
  }
  return absl::OkStatus();
}

std::int32_t argmax(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double log_probability(std::span<const float> logits, std::int32_t id) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x) - mx);
  return static_cast<double>(logits[static_cast<std::size_t>(id)]) - mx - std::log(z);
}

std::int32_t Sampler::next(std::span<const float> logits) {
  if (o_.greedy()) return argmax(logits);
  // Softmax of logits / temperature over every id, in double, as
  // exp((x - max) / t): never inf - inf, so a tiny t tends to greedy
  // instead of NaN.
  const double t = o_.temperature;
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  kept_.clear();
  double z = 0;
  for (std::size_t i = 0; i < logits.size(); i++) {
    const double e = std::exp((logits[i] - mx) / t);
    z += e;
    kept_.emplace_back(e, static_cast<std::int32_t>(i));
  }
  // Most likely first (lowest id on a tie), so a filter keeps a prefix.
  auto more_likely = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  if (o_.top_k > 1) {
    const auto k = std::min(kept_.size(), static_cast<std::size_t>(o_.top_k));
    std::partial_sort(kept_.begin(), kept_.begin() + static_cast<std::ptrdiff_t>(k), kept_.end(),
                      more_likely);
    kept_.resize(k);
  } else if (o_.top_p > 0.0) {
    std::sort(kept_.begin(), kept_.end(), more_likely);
    double cum = 0;
    std::size_t k = 0;
    while (k < kept_.size()) {
      cum += kept_[k++].first / z;
      if (cum > o_.top_p) break;  // the id crossing top_p stays (Megatron's shift)
    }
    kept_.resize(k);
  }
  double total = 0;
  for (const auto& [p, id] : kept_) total += p;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * total;
  double cum = 0;
  for (const auto& [p, id] : kept_) {
    cum += p;
    if (u < cum) return id;
  }
  return kept_.back().second;  // u rounded up to the total
}

absl::StatusOr<Generated> generate(LanguageModel& lm, std::span<const std::int32_t> prompt,
                                   const GenerateOptions& o, const StepObserver& observe) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (o.max_new_tokens < 0) return absl::InvalidArgumentError("max_new_tokens is negative");
  const std::int64_t need = static_cast<std::int64_t>(prompt.size()) + o.max_new_tokens;
  if (need > lm.context()) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt's ", prompt.size(), " tokens and ",
                                                   o.max_new_tokens, " new ones need ", need,
                                                   " positions; the model has ", lm.context()));
  }
  if (absl::Status st = o.sampling.validate(); !st.ok()) return st;
  Generated out;
  Sampler sampler(o.sampling);
  std::vector<std::int32_t> seq(prompt.begin(), prompt.end());
  const auto V = static_cast<std::size_t>(lm.vocab());
  std::size_t fed = 0;              // positions the model holds
  std::vector<float> first_logits;  // the prompt's last row, when the prompt was scored
  if (o.logprobs) {
    // The prompt's forward with every position's logits: row i scores id i + 1.
    absl::StatusOr<std::span<const float>> all = lm.forward(seq, 0, Logits::kAll);
    if (!all.ok()) return all.status();
    for (std::size_t i = 0; i + 1 < seq.size(); i++) {
      out.prompt_logprobs.push_back(log_probability(all->subspan(i * V, V), seq[i + 1]));
    }
    fed = seq.size();
    if (o.max_new_tokens == 0) return out;
    // The last position's logits give the first new id.
    first_logits.assign(all->end() - static_cast<std::ptrdiff_t>(V), all->end());
  }
  while (static_cast<int>(out.tokens.size()) < o.max_new_tokens) {
    std::span<const float> logits;
    if (!first_logits.empty()) {
      logits = first_logits;
    } else {
      const std::size_t from = o.use_cache ? fed : 0;
      const std::span<const std::int32_t> feed(seq.data() + from, seq.size() - from);
      absl::StatusOr<std::span<const float>> got =
          lm.forward(feed, static_cast<std::int64_t>(from), Logits::kLast);
      if (!got.ok()) return got.status();
      logits = *got;
    }
    fed = seq.size();
    const std::int32_t id = sampler.next(logits);
    if (observe) observe(logits, id);
    out.tokens.push_back(id);
    if (o.logprobs) out.logprobs.push_back(log_probability(logits, id));
    first_logits.clear();
    seq.push_back(id);
    if (id == o.eod) {
      out.stopped_at_eod = true;
      break;
    }
  }
  return out;
}

}  // namespace troupe::model
