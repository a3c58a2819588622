// Document sources, splits, GPT sample indices (with their cache), blending.
#include "model/data/gpt_dataset.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "model/atomic_file.h"
#include "model/data/indexed_dataset.h"
#include "model/init.h"

namespace troupe::model::data {
namespace {

class IndexedDocuments final : public DocumentSource {
 public:
  IndexedDocuments(std::unique_ptr<IndexedDataset> ds, std::string fingerprint)
      : ds_(std::move(ds)), fingerprint_(std::move(fingerprint)) {
    starts_.reserve(static_cast<std::size_t>(ds_->num_sequences()) + 1);
    std::int64_t pos = 0;
    for (std::int64_t i = 0; i < ds_->num_sequences(); i++) {
      starts_.push_back(pos);
      pos += ds_->sequence_size(i);
    }
    starts_.push_back(pos);
  }
  std::string name() const override { return ds_->prefix() + ".bin"; }
  std::string fingerprint() const override { return fingerprint_; }
  std::int64_t num_documents() const override { return ds_->num_sequences(); }
  std::int64_t document_size(std::int64_t doc) const override {
    return starts_[static_cast<std::size_t>(doc) + 1] - starts_[static_cast<std::size_t>(doc)];
  }
  absl::Status read(std::int64_t doc, std::int64_t offset,
                    std::span<std::int32_t> out) const override {
    return ds_->read(starts_[static_cast<std::size_t>(doc)] + offset, out);
  }
  std::int64_t position(std::int64_t doc, std::int64_t offset) const override {
    return starts_[static_cast<std::size_t>(doc)] + offset;
  }

 private:
  std::unique_ptr<IndexedDataset> ds_;
  std::string fingerprint_;
  std::vector<std::int64_t> starts_;
};

class MemoryDocuments final : public DocumentSource {
 public:
  MemoryDocuments(std::string name, std::vector<std::vector<std::int32_t>> docs)
      : name_(std::move(name)), docs_(std::move(docs)) {
    std::int64_t pos = 0;
    for (const auto& d : docs_) {
      starts_.push_back(pos);
      pos += static_cast<std::int64_t>(d.size());
    }
  }
  std::string name() const override { return name_; }
  std::string fingerprint() const override { return name_; }
  std::int64_t num_documents() const override { return static_cast<std::int64_t>(docs_.size()); }
  std::int64_t document_size(std::int64_t doc) const override {
    return static_cast<std::int64_t>(docs_[static_cast<std::size_t>(doc)].size());
  }
  absl::Status read(std::int64_t doc, std::int64_t offset,
                    std::span<std::int32_t> out) const override {
    const auto& d = docs_[static_cast<std::size_t>(doc)];
    if (offset < 0 ||
        offset + static_cast<std::int64_t>(out.size()) > static_cast<std::int64_t>(d.size())) {
      return absl::OutOfRangeError(absl::StrCat(name_, ": read past document ", doc));
    }
    std::copy_n(d.begin() + offset, out.size(), out.begin());
    return absl::OkStatus();
  }
  std::int64_t position(std::int64_t doc, std::int64_t offset) const override {
    return starts_[static_cast<std::size_t>(doc)] + offset;
  }

 private:
  std::string name_;
  std::vector<std::vector<std::int32_t>> docs_;
  std::vector<std::int64_t> starts_;
};

std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "?";
  return absl::StrCat(st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr char kCacheMagic[8] = {'T', 'R', 'P', 'S', 'M', 'P', '2', '\0'};

}  // namespace

absl::StatusOr<std::shared_ptr<DocumentSource>> open_indexed_documents(const std::string& prefix) {
  auto ds = IndexedDataset::open(prefix);
  if (!ds.ok()) return ds.status();
  char* real = ::realpath((prefix + ".idx").c_str(), nullptr);
  std::string where = real ? real : prefix;
  std::free(real);
  std::string fp =
      absl::StrCat(where, "|", file_stamp(prefix + ".idx"), "|", file_stamp(prefix + ".bin"));
  return std::shared_ptr<DocumentSource>(std::make_shared<IndexedDocuments>(std::move(*ds), fp));
}

std::shared_ptr<DocumentSource> memory_documents(std::string name,
                                                 std::vector<std::vector<std::int32_t>> docs) {
  return std::make_shared<MemoryDocuments>(std::move(name), std::move(docs));
}

std::vector<std::int64_t> shuffled_indices(std::int64_t n, std::uint64_t seed,
                                           std::uint64_t stream) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  const std::array<std::uint32_t, 2> key = {static_cast<std::uint32_t>(seed),
                                            static_cast<std::uint32_t>(seed >> 32)};
  for (std::int64_t i = n - 1; i > 0; i--) {
    auto r =
        philox4x32({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                    static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                   key);
    const std::uint64_t bits = (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
    const auto j = static_cast<std::int64_t>(bits % static_cast<std::uint64_t>(i + 1));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

absl::StatusOr<SplitRatio> parse_split(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, absl::ByAnyChar(",/"));
  if (parts.empty() || parts.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--split '", text, "': want up to three numbers, as 969,30,1"));
  }
  SplitRatio r{{0.0, 0.0, 0.0}};
  double total = 0;
  for (std::size_t i = 0; i < parts.size(); i++) {
    double v = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(parts[i]), &v) || !(v >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--split '", text, "': '", parts[i], "' is not a non-negative number"));
    }
    r.share[i] = v;
    total += v;
  }
  if (!(total > 0))
    return absl::InvalidArgumentError(absl::StrCat("--split '", text, "': shares sum to 0"));
  for (double& s : r.share) s /= total;
  return r;
}

std::pair<std::int64_t, std::int64_t> SplitRatio::range(Split split, std::int64_t n) const {
  std::array<std::int64_t, 4> index{0, 0, 0, 0};
  for (int i = 0; i < 3; i++) {
    // Python's round(), as Megatron: halves to even (nearbyint in the default
    // rounding mode), not away from zero.
    index[i + 1] =
        index[i] + static_cast<std::int64_t>(std::nearbyint(share[i] * static_cast<double>(n)));
  }
  const std::int64_t diff = index[3] - n;
  for (int i = 1; i < 4; i++) index[i] -= diff;
  const int s = static_cast<int>(split);
  return {index[s], index[s + 1]};
}

absl::StatusOr<std::unique_ptr<GptDataset>> GptDataset::build(
    std::shared_ptr<DocumentSource> source, std::pair<std::int64_t, std::int64_t> docs,
    const SampleSpec& spec, std::int64_t num_samples, std::string label) {
  std::unique_ptr<GptDataset> d(new GptDataset());
  d->source_ = std::move(source);
  d->spec_ = spec;
  d->label_ = std::move(label);
  d->num_samples_ = num_samples;
  std::int64_t tokens = 0;
  for (std::int64_t k = docs.first; k < docs.second; k++) tokens += d->source_->document_size(k);
  if (tokens < 1 || num_samples < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(d->source_->name(), ": the ", d->label_, " split (documents ", docs.first,
                     "..", docs.second, ") holds ", tokens, " tokens; it needs some to make ",
                     num_samples, " samples (check --split)"));
  }
  // Epochs: enough that (epochs * tokens - 1) / T >= num_samples.
  const std::int64_t needed = num_samples * spec.T + 1;
  const std::int64_t epochs = (needed + tokens - 1) / tokens;
  if (epochs * (docs.second - docs.first) > (std::int64_t{1} << 31)) {
    return absl::FailedPreconditionError(absl::StrCat(d->source_->name(), ": the ", d->label_,
                                                      " split is too small for ", num_samples,
                                                      " samples (", epochs, " epochs)"));
  }
  d->epochs_ = static_cast<int>(epochs);
  if (!spec.cache_dir.empty()) {
    const std::string key =
        absl::StrCat(d->source_->fingerprint(), "|", docs.first, "|", docs.second, "|", spec.T, "|",
                     spec.seed, "|", spec.shuffle, "|", num_samples);
    std::string base = d->source_->name();
    base = base.substr(base.find_last_of('/') + 1);
    d->cache_file_ =
        absl::StrFormat("%s/%s_%s_%016x.samples", spec.cache_dir, base, d->label_, fnv1a(key));
    if (d->load_cache(docs).ok()) {
      d->from_cache_ = true;
      return d;
    }
  }
  d->build_indices(docs, tokens);
  if (!d->cache_file_.empty()) (void)d->save_cache();  // read-only data: indices stay in memory
  return d;
}

void GptDataset::build_indices(std::pair<std::int64_t, std::int64_t> docs, std::int64_t) {
  const std::int64_t n = docs.second - docs.first;
  doc_idx_.reserve(static_cast<std::size_t>(n * epochs_));
  for (int e = 0; e < epochs_; e++) {
    if (spec_.shuffle) {
      for (std::int64_t k : shuffled_indices(n, spec_.seed, 2 * static_cast<std::uint64_t>(e))) {
        doc_idx_.push_back(static_cast<std::int32_t>(docs.first + k));
      }
    } else {
      for (std::int64_t k = 0; k < n; k++)
        doc_idx_.push_back(static_cast<std::int32_t>(docs.first + k));
    }
  }
  // Sample i starts T tokens after sample i-1 (its last token is the next
  // sample's first: inputs and targets overlap by one), as Megatron's
  // build_sample_idx walks it: a start is always inside a document that has
  // tokens (so a sample ending at a document's end is followed by the next
  // document with tokens, past any empty ones), except sample 0 at (0, 0).
  // The epochs hold at least num_samples * T + 1 tokens, so the walk never
  // runs past doc_idx_.
  sample_doc_.resize(static_cast<std::size_t>(num_samples_) + 1);
  sample_offset_.resize(sample_doc_.size());
  std::int64_t pos = 0, offset = 0;
  for (std::size_t i = 0; i < sample_doc_.size(); i++) {
    if (i > 0) {
      std::int64_t remaining = std::int64_t{spec_.T} + 1;  // this sample's tokens still to find
      for (;;) {
        const std::int64_t avail =
            source_->document_size(doc_idx_[static_cast<std::size_t>(pos)]) - offset;
        if (avail >= remaining) {
          offset += remaining - 1;  // the next sample starts at this one's last token
          break;
        }
        remaining -= avail;
        pos++;
        offset = 0;
      }
    }
    sample_doc_[i] = pos;
    sample_offset_[i] = offset;
  }
  if (spec_.shuffle) {
    shuffle_idx_ = shuffled_indices(num_samples_, spec_.seed, 1);
  } else {
    shuffle_idx_.resize(static_cast<std::size_t>(num_samples_));
    std::iota(shuffle_idx_.begin(), shuffle_idx_.end(), 0);
  }
}

absl::Status GptDataset::sample(std::int64_t i, std::span<std::int32_t> out) const {
  if (i < 0 || i >= num_samples_ || static_cast<std::int64_t>(out.size()) != spec_.T + 1) {
    return absl::OutOfRangeError(absl::StrCat(label_, " sample ", i, " of ", num_samples_));
  }
  const auto j = static_cast<std::size_t>(shuffle_idx_[static_cast<std::size_t>(i)]);
  std::int64_t pos = sample_doc_[j], offset = sample_offset_[j];
  std::size_t done = 0;
  while (done < out.size()) {
    if (static_cast<std::size_t>(pos) >= doc_idx_.size()) {
      return absl::InternalError(absl::StrCat(label_, ": sample ", i, " runs past the last epoch"));
    }
    const std::int64_t doc = doc_idx_[static_cast<std::size_t>(pos)];
    const std::int64_t take = std::min<std::int64_t>(source_->document_size(doc) - offset,
                                                     static_cast<std::int64_t>(out.size() - done));
    absl::Status st = source_->read(doc, offset, out.subspan(done, static_cast<std::size_t>(take)));
    if (!st.ok()) return st;
    for (std::int64_t k = 0; k < take; k++) {
      const std::int32_t t = out[done + static_cast<std::size_t>(k)];
      if (t < 0 || t >= spec_.V) {
        return absl::InvalidArgumentError(absl::StrCat(
            source_->name(), ": token id ", t, " at position ", source_->position(doc, offset + k),
            " is outside the vocabulary [0, ", spec_.V, ")"));
      }
    }
    done += static_cast<std::size_t>(take);
    pos++;
    offset = 0;
  }
  return absl::OkStatus();
}

std::string GptDataset::describe() const {
  return absl::StrCat(source_->name(), " (", label_, "): ", num_samples_, " samples of ", spec_.T,
                      " tokens, ", epochs_, " epoch", epochs_ == 1 ? "" : "s",
                      spec_.shuffle ? ", shuffled" : ", file order",
                      from_cache_ ? ", indices from cache" : "");
}

// The cache file: magic, u64 n_doc, u64 n_samples, u64 CRC-32 of the body,
// then the body: i32 doc_idx[n_doc], i64 sample_doc[n_samples + 1],
// i64 sample_offset[n_samples + 1], i64 shuffle[n_samples].
namespace {

// zlib's CRC-32 (a library's, not ours), in chunks of at most 1 GiB (its
// length argument is 32 bits).
std::uint64_t body_checksum(const char* p, std::size_t n) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (std::size_t done = 0; done < n;) {
    const std::size_t piece = std::min<std::size_t>(n - done, 1u << 30);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(p + done), static_cast<uInt>(piece));
    done += piece;
  }
  return crc;
}

template <typename T>
void take(const char*& p, std::vector<T>& v) {
  std::memcpy(v.data(), p, v.size() * sizeof(T));
  p += v.size() * sizeof(T);
}

}  // namespace

// Loads the indices of a previous build; anything short, stale, corrupt (the
// checksum) or inconsistent is DataLoss (and the caller rebuilds), never
// trusted.
absl::Status GptDataset::load_cache(std::pair<std::int64_t, std::int64_t> docs) {
  std::ifstream in(cache_file_, std::ios::binary);
  if (!in) return absl::NotFoundError(cache_file_);
  char magic[8];
  std::uint64_t n_doc = 0, n_samples = 0, checksum = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&n_doc), 8);
  in.read(reinterpret_cast<char*>(&n_samples), 8);
  in.read(reinterpret_cast<char*>(&checksum), 8);
  const auto expected_docs =
      static_cast<std::uint64_t>(epochs_) * static_cast<std::uint64_t>(docs.second - docs.first);
  auto corrupt = [&] {
    return absl::DataLossError(absl::StrCat(cache_file_, ": stale or corrupt"));
  };
  if (!in || std::memcmp(magic, kCacheMagic, 8) != 0 || n_doc != expected_docs ||
      n_samples != static_cast<std::uint64_t>(num_samples_)) {
    return corrupt();
  }
  std::string body(n_doc * 4 + (n_samples + 1) * 16 + n_samples * 8, '\0');
  in.read(body.data(), static_cast<std::streamsize>(body.size()));
  if (!in || in.peek() != EOF || body_checksum(body.data(), body.size()) != checksum) {
    return corrupt();
  }
  std::vector<std::int32_t> doc_idx(n_doc);
  std::vector<std::int64_t> sample_doc(n_samples + 1), sample_offset(n_samples + 1),
      shuffle(n_samples);
  const char* p = body.data();
  take(p, doc_idx);
  take(p, sample_doc);
  take(p, sample_offset);
  take(p, shuffle);
  if (!indices_consistent(docs, doc_idx, sample_doc, sample_offset, shuffle)) return corrupt();
  doc_idx_ = std::move(doc_idx);
  sample_doc_ = std::move(sample_doc);
  sample_offset_ = std::move(sample_offset);
  shuffle_idx_ = std::move(shuffle);
  return absl::OkStatus();
}

// What the checksum cannot promise: documents of the range, each sample start
// inside doc_idx and exactly T tokens after the previous one, the last
// sample's T+1 tokens inside the epochs, and a shuffle that is a permutation.
// Then every sample reads without error.
bool GptDataset::indices_consistent(std::pair<std::int64_t, std::int64_t> docs,
                                    const std::vector<std::int32_t>& doc_idx,
                                    const std::vector<std::int64_t>& sample_doc,
                                    const std::vector<std::int64_t>& sample_offset,
                                    const std::vector<std::int64_t>& shuffle) const {
  std::vector<std::int64_t> start(doc_idx.size() + 1, 0);  // stream position of doc_idx[k]
  for (std::size_t k = 0; k < doc_idx.size(); k++) {
    if (doc_idx[k] < docs.first || doc_idx[k] >= docs.second) return false;
    start[k + 1] = start[k] + source_->document_size(doc_idx[k]);
  }
  for (std::size_t i = 0; i < sample_doc.size(); i++) {
    const std::int64_t pos = sample_doc[i], off = sample_offset[i];
    if (pos < 0 || pos >= static_cast<std::int64_t>(doc_idx.size()) || off < 0 ||
        off >= std::max<std::int64_t>(
                   source_->document_size(doc_idx[static_cast<std::size_t>(pos)]), 1)) {
      return false;
    }
    const std::int64_t at = start[static_cast<std::size_t>(pos)] + off;
    if (at != static_cast<std::int64_t>(i) * spec_.T) return false;
  }
  if (num_samples_ * spec_.T + 1 > start.back()) return false;
  std::vector<bool> seen(shuffle.size(), false);
  for (std::int64_t j : shuffle) {
    if (j < 0 || j >= num_samples_ || seen[static_cast<std::size_t>(j)]) return false;
    seen[static_cast<std::size_t>(j)] = true;
  }
  return true;
}

absl::Status GptDataset::save_cache() const {
  const std::string dir = spec_.cache_dir;
  ::mkdir(dir.c_str(), 0755);
  std::string body;
  auto append = [&](const auto& v) {
    body.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
  };
  append(doc_idx_);
  append(sample_doc_);
  append(sample_offset_);
  append(shuffle_idx_);
  absl::StatusOr<AtomicFile> out = AtomicFile::create(cache_file_);
  if (!out.ok()) return out.status();
  const std::uint64_t n_doc = doc_idx_.size(), n_samples = static_cast<std::uint64_t>(num_samples_),
                      checksum = body_checksum(body.data(), body.size());
  absl::Status st = out->write(kCacheMagic, 8);
  if (st.ok()) st = out->write(&n_doc, 8);
  if (st.ok()) st = out->write(&n_samples, 8);
  if (st.ok()) st = out->write(&checksum, 8);
  if (st.ok()) st = out->write(body.data(), body.size());
  return st.ok() ? out->commit() : st;
}

// ---- blending ---------------------------------------------------------------

namespace {

// Megatron's build_blending_indices: for sample k, the dataset with the
// largest weight * max(k, 1) - (samples it has given so far).
void blend(const std::vector<double>& w, std::int64_t n, std::vector<std::int16_t>* index,
           std::vector<std::int64_t>* sample, std::vector<std::int64_t>* counts) {
  counts->assign(w.size(), 0);
  if (index) index->resize(static_cast<std::size_t>(n));
  if (sample) sample->resize(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; k++) {
    const double x = std::max<double>(static_cast<double>(k), 1.0);
    std::size_t best = 0;
    double best_err = w[0] * x - static_cast<double>((*counts)[0]);
    for (std::size_t i = 1; i < w.size(); i++) {
      const double err = w[i] * x - static_cast<double>((*counts)[i]);
      if (err > best_err) {
        best_err = err;
        best = i;
      }
    }
    if (index) (*index)[static_cast<std::size_t>(k)] = static_cast<std::int16_t>(best);
    if (sample) (*sample)[static_cast<std::size_t>(k)] = (*counts)[best];
    (*counts)[best]++;
  }
}

}  // namespace

std::vector<std::int64_t> BlendedDataset::samples_needed(const std::vector<double>& weights,
                                                         std::int64_t num_samples) {
  std::vector<std::int64_t> counts;
  blend(weights, num_samples, nullptr, nullptr, &counts);
  return counts;
}

absl::StatusOr<std::unique_ptr<BlendedDataset>> BlendedDataset::build(
    std::vector<double> weights, std::vector<std::unique_ptr<SampleSource>> datasets,
    std::int64_t num_samples) {
  if (weights.empty() || weights.size() != datasets.size() || weights.size() > 32767) {
    return absl::InvalidArgumentError("blend: one weight per dataset");
  }
  auto b = std::make_unique<BlendedDataset>();
  b->weights_ = std::move(weights);
  b->datasets_ = std::move(datasets);
  std::vector<std::int64_t> counts;
  blend(b->weights_, num_samples, &b->dataset_index_, &b->dataset_sample_, &counts);
  for (std::size_t i = 0; i < counts.size(); i++) {
    if (counts[i] > b->datasets_[i]->size()) {
      return absl::FailedPreconditionError(absl::StrCat("blend: ", b->datasets_[i]->describe(),
                                                        " has fewer than the ", counts[i],
                                                        " samples it must give"));
    }
  }
  return b;
}

absl::Status BlendedDataset::sample(std::int64_t i, std::span<std::int32_t> out) const {
  if (i < 0 || i >= size()) return absl::OutOfRangeError(absl::StrCat("blended sample ", i));
  const auto k = static_cast<std::size_t>(i);
  return datasets_[static_cast<std::size_t>(dataset_index_[k])]->sample(dataset_sample_[k], out);
}

std::string BlendedDataset::describe() const {
  std::string s = absl::StrCat("blend of ", datasets_.size(), ", ", size(), " samples:");
  for (std::size_t i = 0; i < datasets_.size(); i++) {
    absl::StrAppend(&s, "\n    ", absl::StrFormat("%.3f", weights_[i]), "  ",
                    datasets_[i]->describe());
  }
  return s;
}

absl::Status load_batch(const SampleSource& source, std::int64_t first, int B, int T,
                        std::int32_t* tokens, std::int32_t* targets) {
  std::vector<std::int32_t> buf(static_cast<std::size_t>(T) + 1);
  for (int b = 0; b < B; b++) {
    absl::Status st = source.sample(first + b, buf);
    if (!st.ok()) return st;
    std::copy_n(buf.begin(), T, tokens + static_cast<std::ptrdiff_t>(b) * T);
    std::copy_n(buf.begin() + 1, T, targets + static_cast<std::ptrdiff_t>(b) * T);
  }
  return absl::OkStatus();
}

}  // namespace troupe::model::data
