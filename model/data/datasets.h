// From the data flags to the train and validation sample sources, as
// Megatron's --data-path, --split and --data-cache-path define them:
//   --data-path PREFIX                     one dataset
//   --data-path 0.3 A 0.7 B                a blend: weights, then prefixes
//   (none)                                 the synthetic phrase corpus
// Every dataset is split by the same ratio; the blend is taken per split.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/data/gpt_dataset.h"

namespace troupe::model::data {

struct DataOptions {
  std::vector<std::string> data_path;
  std::string split = "969,30,1";
  std::string cache_path;  // empty: <directory of the first dataset>/cache
  bool shuffle = true;
  std::uint64_t seed = 1234;
  int T = 0, V = 0;
};

// "0.3 A 0.7 B" -> {(0.3, A), (0.7, B)} with weights normalised; "A" ->
// {(1, A)}. InvalidArgument naming --data-path otherwise.
absl::StatusOr<std::vector<std::pair<double, std::string>>> parse_data_path(
    const std::vector<std::string>& args);

struct Datasets {
  std::unique_ptr<SampleSource> train;
  std::unique_ptr<SampleSource> valid;  // null when no validation samples were asked for
};

absl::StatusOr<Datasets> build_datasets(const DataOptions& options, std::int64_t train_samples,
                                        std::int64_t valid_samples);

}  // namespace troupe::model::data
