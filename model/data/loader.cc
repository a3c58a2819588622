// Token sources and the sample loader.
#include "model/data/loader.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "model/data/indexed_dataset.h"
#include "model/init.h"

namespace troupe::model::data {
namespace {

class IndexedSource final : public TokenSource {
 public:
  explicit IndexedSource(std::unique_ptr<IndexedDataset> ds) : ds_(std::move(ds)) {}
  std::string name() const override { return ds_->prefix() + ".bin"; }
  std::int64_t num_tokens() const override { return ds_->num_tokens(); }
  absl::Status read(std::int64_t position, std::span<std::int32_t> out) const override {
    return ds_->read(position, out);
  }

 private:
  std::unique_ptr<IndexedDataset> ds_;
};

class MemorySource final : public TokenSource {
 public:
  MemorySource(std::string name, std::vector<std::int32_t> tokens)
      : name_(std::move(name)), tokens_(std::move(tokens)) {}
  std::string name() const override { return name_; }
  std::int64_t num_tokens() const override { return static_cast<std::int64_t>(tokens_.size()); }
  absl::Status read(std::int64_t position, std::span<std::int32_t> out) const override {
    if (position < 0 || position + static_cast<std::int64_t>(out.size()) > num_tokens()) {
      return absl::OutOfRangeError(absl::StrCat(name_, ": read past the end"));
    }
    std::copy_n(tokens_.begin() + position, out.size(), out.begin());
    return absl::OkStatus();
  }

 private:
  std::string name_;
  std::vector<std::int32_t> tokens_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TokenSource>> open_indexed_source(const std::string& prefix) {
  auto ds = IndexedDataset::open(prefix);
  if (!ds.ok()) return ds.status();
  return std::unique_ptr<TokenSource>(std::make_unique<IndexedSource>(std::move(*ds)));
}

std::unique_ptr<TokenSource> memory_source(std::string name, std::vector<std::int32_t> tokens) {
  return std::make_unique<MemorySource>(std::move(name), std::move(tokens));
}

std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  const std::array<std::uint32_t, 2> key = {static_cast<std::uint32_t>(seed),
                                            static_cast<std::uint32_t>(seed >> 32)};
  for (std::int64_t i = n - 1; i > 0; i--) {
    auto r = philox4x32({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                         static_cast<std::uint32_t>(epoch), 0x5eedu},
                        key);
    const std::uint64_t bits = (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
    const std::int64_t j = static_cast<std::int64_t>(bits % static_cast<std::uint64_t>(i + 1));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

GptLoader::GptLoader(std::unique_ptr<TokenSource> source, LoaderOptions options)
    : source_(std::move(source)), options_(options) {
  num_samples_ = (source_->num_tokens() - 1) / options_.T;
  buffer_.resize(static_cast<std::size_t>(options_.T) + 1);
}

absl::StatusOr<std::unique_ptr<GptLoader>> GptLoader::create(std::unique_ptr<TokenSource> source,
                                                             LoaderOptions options) {
  if (options.T <= 0 || options.V <= 0) {
    return absl::InvalidArgumentError("loader: T and V must be positive");
  }
  if (source->num_tokens() < options.T + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source->name(), ": holds ", source->num_tokens(), " tokens, fewer than one sample of ",
        options.T + 1, " (--seq-len + 1)"));
  }
  return std::unique_ptr<GptLoader>(new GptLoader(std::move(source), options));
}

std::int64_t GptLoader::index_in_epoch(std::int64_t k) {
  const std::int64_t epoch = k / num_samples_, i = k % num_samples_;
  if (!options_.shuffle) return i;
  if (epoch != permuted_epoch_) {
    permutation_ = shuffled_indices(num_samples_, options_.seed, epoch);
    permuted_epoch_ = epoch;
  }
  return permutation_[static_cast<std::size_t>(i)];
}

absl::Status GptLoader::sample(std::int64_t k, std::span<std::int32_t> tokens,
                               std::span<std::int32_t> targets) {
  const std::int64_t T = options_.T;
  const std::int64_t start = index_in_epoch(k) * T;
  absl::Status st = source_->read(start, buffer_);
  if (!st.ok()) return st;
  for (std::int64_t i = 0; i <= T; i++) {
    const std::int32_t t = buffer_[static_cast<std::size_t>(i)];
    if (t < 0 || t >= options_.V) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_->name(), ": token id ", t, " at position ", start + i,
          " is outside the vocabulary [0, ", options_.V, ")"));
    }
  }
  std::copy_n(buffer_.begin(), T, tokens.begin());
  std::copy_n(buffer_.begin() + 1, T, targets.begin());
  return absl::OkStatus();
}

absl::Status GptLoader::batch(std::int64_t first, int B, std::int32_t* tokens,
                              std::int32_t* targets) {
  const std::size_t T = static_cast<std::size_t>(options_.T);
  for (int b = 0; b < B; b++) {
    absl::Status st = sample(first + b, {tokens + b * T, T}, {targets + b * T, T});
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace troupe::model::data
