// GPT training samples as Megatron-LM's GPTDataset builds them, and blends
// of several datasets as its BlendedDataset.
//
// For one dataset and one split (a contiguous range of its documents):
//   doc_idx      the split's documents, repeated for as many epochs as the
//                requested samples need, each epoch shuffled from the seed;
//   sample_idx   where sample i starts: (position in doc_idx, token offset);
//                sample i is the T+1 tokens from there, across documents
//                (documents of no tokens are stepped over; the index is the
//                one Megatron's helpers.cpp build_sample_idx makes);
//   shuffle_idx  a permutation of the samples, from the seed.
// The indices are cached in one file per (dataset, split, T, seed, shuffle,
// samples, dataset size and mtime) under the cache directory, written to a
// temporary name and renamed, so concurrent ranks agree and a changed
// dataset gets new indices. With shuffle off, sample i is tokens
// [i*T, i*T + T + 1) of the split's documents in file order.
//
//   auto parts = data::parse_split("969,30,1");
//   auto ds = data::GptDataset::build(source, parts->range(kTrain, n_docs), spec, 10000);
//   RETURN_IF_ERROR((*ds)->sample(i, tokens));   // T+1 tokens
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::model::data {

// Documents to draw samples from: an indexed dataset or text in memory.
class DocumentSource {
 public:
  virtual ~DocumentSource() = default;
  virtual std::string name() const = 0;  // for messages (the .bin it reads)
  // Stable identity of the contents, for cache names (path, size, mtime).
  virtual std::string fingerprint() const = 0;
  virtual std::int64_t num_documents() const = 0;
  virtual std::int64_t document_size(std::int64_t doc) const = 0;
  virtual absl::Status read(std::int64_t doc, std::int64_t offset,
                            std::span<std::int32_t> out) const = 0;
  // Token position of (doc, offset) in the whole file, for messages.
  virtual std::int64_t position(std::int64_t doc, std::int64_t offset) const = 0;
};

absl::StatusOr<std::shared_ptr<DocumentSource>> open_indexed_documents(const std::string& prefix);
std::shared_ptr<DocumentSource> memory_documents(std::string name,
                                                 std::vector<std::vector<std::int32_t>> docs);

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };

// "969,30,1" (Megatron's --split): train/valid/test shares of the documents.
struct SplitRatio {
  std::array<double, 3> share{1.0, 0.0, 0.0};
  // Document range [begin, end) of `split` among `n` documents, as
  // Megatron's get_train_valid_test_split_.
  std::pair<std::int64_t, std::int64_t> range(Split split, std::int64_t n) const;
};
absl::StatusOr<SplitRatio> parse_split(const std::string& text);

struct SampleSpec {
  int T = 0;
  int V = 0;  // every token must be below it (InvalidArgument naming file and position)
  std::uint64_t seed = 1234;
  bool shuffle = true;
  std::string cache_dir;  // empty: indices are built in memory only
};

// Samples of T+1 tokens, indexable: the interface the loader reads.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual std::int64_t size() const = 0;
  virtual absl::Status sample(std::int64_t i, std::span<std::int32_t> out) const = 0;  // T+1
  virtual std::string describe() const = 0;
};

class GptDataset final : public SampleSource {
 public:
  // At least `num_samples` samples of the documents [docs.first, docs.second)
  // (more epochs are added as needed). FailedPrecondition if the range holds
  // fewer than T+1 tokens.
  static absl::StatusOr<std::unique_ptr<GptDataset>> build(
      std::shared_ptr<DocumentSource> source, std::pair<std::int64_t, std::int64_t> docs,
      const SampleSpec& spec, std::int64_t num_samples, std::string label);

  std::int64_t size() const override { return num_samples_; }
  absl::Status sample(std::int64_t i, std::span<std::int32_t> out) const override;
  std::string describe() const override;
  int epochs() const { return epochs_; }
  // Where sample j (before shuffling, 0 <= j <= size()) starts: (position in
  // doc_idx, token offset), Megatron's sample_idx[j].
  std::pair<std::int64_t, std::int64_t> sample_start(std::int64_t j) const {
    return {sample_doc_[static_cast<std::size_t>(j)], sample_offset_[static_cast<std::size_t>(j)]};
  }
  bool from_cache() const { return from_cache_; }
  const std::string& cache_file() const { return cache_file_; }

 private:
  GptDataset() = default;
  void build_indices(std::pair<std::int64_t, std::int64_t> docs, std::int64_t tokens_per_epoch);
  absl::Status load_cache(std::pair<std::int64_t, std::int64_t> docs);
  absl::Status save_cache() const;
  bool indices_consistent(std::pair<std::int64_t, std::int64_t> docs,
                          const std::vector<std::int32_t>& doc_idx,
                          const std::vector<std::int64_t>& sample_doc,
                          const std::vector<std::int64_t>& sample_offset,
                          const std::vector<std::int64_t>& shuffle) const;

  std::shared_ptr<DocumentSource> source_;
  SampleSpec spec_;
  std::string label_, cache_file_;
  std::int64_t num_samples_ = 0;
  int epochs_ = 0;
  bool from_cache_ = false;
  std::vector<std::int32_t> doc_idx_;
  std::vector<std::int64_t> sample_doc_, sample_offset_;  // num_samples + 1 entries
  std::vector<std::int64_t> shuffle_idx_;
};

// Megatron's blending: sample k comes from the dataset whose share of the
// first k samples is furthest below its weight (ties to the lowest index).
class BlendedDataset final : public SampleSource {
 public:
  static absl::StatusOr<std::unique_ptr<BlendedDataset>> build(
      std::vector<double> weights, std::vector<std::unique_ptr<SampleSource>> datasets,
      std::int64_t num_samples);
  // How many samples of each dataset `num_samples` blended samples need.
  static std::vector<std::int64_t> samples_needed(const std::vector<double>& weights,
                                                  std::int64_t num_samples);

  std::int64_t size() const override { return static_cast<std::int64_t>(dataset_index_.size()); }
  absl::Status sample(std::int64_t i, std::span<std::int32_t> out) const override;
  std::string describe() const override;
  std::int16_t dataset_of(std::int64_t i) const {
    return dataset_index_[static_cast<std::size_t>(i)];
  }

 private:
  std::vector<double> weights_;
  std::vector<std::unique_ptr<SampleSource>> datasets_;
  std::vector<std::int16_t> dataset_index_;
  std::vector<std::int64_t> dataset_sample_;
};

// Fisher-Yates permutation of [0, n) from Philox keyed by (seed, stream):
// the same on every platform.
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed,
                                           std::uint64_t stream);

// Megatron's order: replica d's micro-batch j of a step is the global
// batch's micro-batch j*dp + d; samples are counted from the run's start.
inline std::int64_t micro_batch_first_sample(std::int64_t consumed_before_step, int d, int dp,
                                             int j, int B) {
  return consumed_before_step + (static_cast<std::int64_t>(j) * dp + d) * B;
}

// Tokens and targets of B consecutive samples: (B, T) arrays each.
absl::Status load_batch(const SampleSource& source, std::int64_t first, int B, int T,
                        std::int32_t* tokens, std::int32_t* targets);

}  // namespace troupe::model::data
