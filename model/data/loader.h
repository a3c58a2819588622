// Training samples for a GPT: T+1 consecutive tokens of a token stream
// (inputs are the first T, targets the last T), keyed by the number of
// samples consumed so far, so any (step, micro-batch) can be produced alone.
//
// Sample i of an epoch is tokens [i*T, i*T + T + 1) of the stream, crossing
// document boundaries, as Megatron's sample index; with shuffling (the
// default) each epoch visits the samples in a permutation drawn from the seed
// and the epoch. The full Megatron pipeline (document shuffling, splits,
// blending, cached indices) is the data issue's; this reads the same files.
//
//   auto src = data::open_indexed_source("data/pile_text_document");
//   auto loader = data::GptLoader::create(std::move(*src), {.T = 1024, .V = 50257});
//   RETURN_IF_ERROR(loader->batch(step * gbs + j * B, B, tokens, targets));
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::model::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual std::string name() const = 0;  // for messages: the file it reads
  virtual std::int64_t num_tokens() const = 0;
  virtual absl::Status read(std::int64_t position, std::span<std::int32_t> out) const = 0;
};

absl::StatusOr<std::unique_ptr<TokenSource>> open_indexed_source(const std::string& prefix);
std::unique_ptr<TokenSource> memory_source(std::string name, std::vector<std::int32_t> tokens);

struct LoaderOptions {
  int T = 0;             // sequence length
  int V = 0;             // vocabulary size: every token must be below it
  std::uint64_t seed = 1234;
  bool shuffle = true;   // false: samples in file order (--no-shuffle)
};

class GptLoader {
 public:
  // InvalidArgument if the stream holds fewer than T + 1 tokens.
  static absl::StatusOr<std::unique_ptr<GptLoader>> create(std::unique_ptr<TokenSource> source,
                                                           LoaderOptions options);

  std::int64_t num_samples() const { return num_samples_; }
  const TokenSource& source() const { return *source_; }

  // The k-th sample of the run (k = samples consumed before it): tokens and
  // targets of T ids each. A token >= V is InvalidArgument naming the file and
  // its position.
  absl::Status sample(std::int64_t k, std::span<std::int32_t> tokens,
                      std::span<std::int32_t> targets);
  // B consecutive samples starting at `first`, into (B, T) arrays.
  absl::Status batch(std::int64_t first, int B, std::int32_t* tokens, std::int32_t* targets);

 private:
  GptLoader(std::unique_ptr<TokenSource> source, LoaderOptions options);
  std::int64_t index_in_epoch(std::int64_t k);

  std::unique_ptr<TokenSource> source_;
  LoaderOptions options_;
  std::int64_t num_samples_ = 0;
  std::int64_t permuted_epoch_ = -1;
  std::vector<std::int64_t> permutation_;
  std::vector<std::int32_t> buffer_;
};

// Fisher-Yates permutation of [0, n) from a counter-based generator keyed by
// (seed, epoch): the same on every platform.
std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace troupe::model::data
