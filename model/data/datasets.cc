// Building the train/valid sample sources from the data flags.
#include "model/data/datasets.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "model/data/synthetic.h"

namespace troupe::model::data {

absl::StatusOr<std::vector<std::pair<double, std::string>>> parse_data_path(
    const std::vector<std::string>& args) {
  std::vector<std::pair<double, std::string>> out;
  if (args.size() == 1) {
    out.emplace_back(1.0, args[0]);
    return out;
  }
  if (args.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        "--data-path: want one PREFIX, or pairs of WEIGHT PREFIX (as 0.3 A 0.7 B)");
  }
  double total = 0;
  for (std::size_t i = 0; i < args.size(); i += 2) {
    double w = 0;
    if (!absl::SimpleAtod(args[i], &w) || !(w > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data-path: '", args[i], "' is not a positive weight (before ", args[i + 1], ")"));
    }
    out.emplace_back(w, args[i + 1]);
    total += w;
  }
  for (auto& [w, p] : out) w /= total;
  return out;
}

namespace {

std::string default_cache_dir(const std::string& prefix) {
  const std::size_t slash = prefix.find_last_of('/');
  return (slash == std::string::npos ? std::string(".") : prefix.substr(0, slash)) + "/cache";
}

absl::StatusOr<std::unique_ptr<SampleSource>> build_split(
    const std::vector<std::pair<double, std::shared_ptr<DocumentSource>>>& sources,
    const SplitRatio& ratio, Split split, const SampleSpec& spec, std::int64_t num_samples) {
  const char* label = split == Split::kTrain ? "train" : split == Split::kValid ? "valid" : "test";
  if (sources.size() == 1) {
    const auto& src = sources[0].second;
    auto ds =
        GptDataset::build(src, ratio.range(split, src->num_documents()), spec, num_samples, label);
    if (!ds.ok()) return ds.status();
    return std::unique_ptr<SampleSource>(std::move(*ds));
  }
  std::vector<double> weights;
  for (const auto& s : sources) weights.push_back(s.first);
  const std::vector<std::int64_t> counts = BlendedDataset::samples_needed(weights, num_samples);
  std::vector<std::unique_ptr<SampleSource>> parts;
  for (std::size_t i = 0; i < sources.size(); i++) {
    const auto& src = sources[i].second;
    auto ds = GptDataset::build(src, ratio.range(split, src->num_documents()), spec,
                                std::max<std::int64_t>(counts[i], 1), label);
    if (!ds.ok()) return ds.status();
    parts.push_back(std::move(*ds));
  }
  auto blended = BlendedDataset::build(weights, std::move(parts), num_samples);
  if (!blended.ok()) return blended.status();
  return std::unique_ptr<SampleSource>(std::move(*blended));
}

}  // namespace

absl::StatusOr<Datasets> build_datasets(const DataOptions& o, std::int64_t train_samples,
                                        std::int64_t valid_samples) {
  auto ratio = parse_split(o.split);
  if (!ratio.ok()) return ratio.status();
  std::vector<std::pair<double, std::shared_ptr<DocumentSource>>> sources;
  SampleSpec spec{
      .T = o.T, .V = o.V, .seed = o.seed, .shuffle = o.shuffle, .cache_dir = o.cache_path};
  if (o.data_path.empty()) {
    PhraseCorpusOptions corpus{.vocab_size = o.V, .seed = o.seed};
    sources.emplace_back(1.0, memory_documents("synthetic phrase corpus", phrase_corpus(corpus)));
    spec.cache_dir.clear();  // nothing to cache next to
  } else {
    auto blend = parse_data_path(o.data_path);
    if (!blend.ok()) return blend.status();
    for (const auto& [w, prefix] : *blend) {
      auto src = open_indexed_documents(prefix);
      if (!src.ok()) return src.status();
      sources.emplace_back(w, std::move(*src));
    }
    if (spec.cache_dir.empty()) spec.cache_dir = default_cache_dir((*blend)[0].second);
  }
  Datasets d;
  auto train = build_split(sources, *ratio, Split::kTrain, spec, train_samples);
  if (!train.ok()) return train.status();
  d.train = std::move(*train);
  if (valid_samples > 0) {
    if (ratio->share[1] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--split ", o.split,
                       " leaves no validation documents, but --eval-iters asks for validation"));
    }
    auto valid = build_split(sources, *ratio, Split::kValid, spec, valid_samples);
    if (!valid.ok()) return valid.status();
    d.valid = std::move(*valid);
  }
  return d;
}

}  // namespace troupe::model::data
