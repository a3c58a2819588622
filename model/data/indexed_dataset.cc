// MMIDIDX reading (mmap) and writing.
#include "model/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace troupe::model::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

std::size_t token_size(TokenDType d) {
  switch (d) {
    case TokenDType::kU8:
    case TokenDType::kI8:
      return 1;
    case TokenDType::kI16:
    case TokenDType::kU16:
      return 2;
    case TokenDType::kI32:
    case TokenDType::kF32:
      return 4;
    case TokenDType::kI64:
    case TokenDType::kF64:
      return 8;
  }
  return 0;
}

absl::StatusOr<std::pair<const char*, std::size_t>> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat failed"));
  }
  const std::size_t size = static_cast<std::size_t>(st.st_size);
  const char* p = nullptr;
  if (size > 0) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap failed"));
    }
    p = static_cast<const char*>(m);
  }
  ::close(fd);
  return std::make_pair(p, size);
}

template <typename T>
T read_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // x86-64 and aarch64 are little-endian, as the format
  return v;
}

}  // namespace

TokenDType token_dtype_for_vocab(std::int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kU16 : TokenDType::kI32;
}

IndexedDataset::~IndexedDataset() {
  if (bin_ != nullptr) ::munmap(const_cast<char*>(bin_), bin_size_);
  if (idx_ != nullptr) ::munmap(const_cast<char*>(idx_), idx_size_);
}

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::open(const std::string& prefix) {
  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  auto idx = map_file(prefix + ".idx");
  if (!idx.ok()) return idx.status();
  std::tie(ds->idx_, ds->idx_size_) = *idx;
  auto bin = map_file(prefix + ".bin");
  if (!bin.ok()) return bin.status();
  std::tie(ds->bin_, ds->bin_size_) = *bin;
  absl::Status st = ds->parse_header();
  if (st.ok()) st = ds->check_sequences();
  if (st.ok()) st = ds->check_documents();
  if (!st.ok()) return st;
  return ds;
}

// Header (34 bytes), then sizes i32[S], pointers i64[S], document index
// i64[D]: the file's size must be exactly that.
absl::Status IndexedDataset::parse_header() {
  const std::string idx_path = prefix_ + ".idx";
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(idx_path, ": ", what));
  };
  const char* p = idx_;
  constexpr std::size_t kHeader = 9 + 8 + 1 + 8 + 8;
  if (idx_size_ < kHeader) return bad("truncated header (not a Megatron MMIDIDX index?)");
  if (std::memcmp(p, kMagic, 9) != 0) return bad("bad magic (not a Megatron MMIDIDX index)");
  if (read_le<std::uint64_t>(p + 9) != 1) {
    return bad(absl::StrCat("unsupported version ", read_le<std::uint64_t>(p + 9)));
  }
  const std::uint8_t code = static_cast<std::uint8_t>(p[17]);
  if (code < 1 || code > 8 || code == 6 || code == 7) {
    return bad(absl::StrCat("dtype code ", code, " is not an integer token type"));
  }
  dtype_ = static_cast<TokenDType>(code);
  const std::uint64_t S = read_le<std::uint64_t>(p + 18);
  const std::uint64_t D = read_le<std::uint64_t>(p + 26);
  const std::uint64_t need = kHeader + S * 4 + S * 8 + D * 8;
  if (S > idx_size_ || D > idx_size_ || need != idx_size_) {
    return bad(absl::StrCat("size ", idx_size_, " bytes does not match ", S, " sequences and ", D,
                            " document indices (", need, " bytes)"));
  }
  if (D < 1) return bad("document index is empty (needs at least the leading 0)");
  sizes_ = p + kHeader;
  pointers_ = p + kHeader + S * 4;
  doc_idx_ = p + kHeader + S * 12;
  num_sequences_ = static_cast<std::int64_t>(S);
  num_doc_idx_ = static_cast<std::int64_t>(D);
  return absl::OkStatus();
}

// Megatron writes the sequences back to back from byte 0 (its pointers are
// the running sum of size x the dtype's width), so each pointer must be where
// the previous sequence ends and the last must end where the .bin does. A
// dtype code that disagrees with the .bin (u8 on u16 data) breaks this.
absl::Status IndexedDataset::check_sequences() {
  const std::string bin_path = prefix_ + ".bin";
  const auto esize = static_cast<std::int64_t>(token_size(dtype_));
  const auto bin_size = static_cast<std::int64_t>(bin_size_);
  starts_.reserve(static_cast<std::size_t>(num_sequences_) + 1);
  std::int64_t pos = 0, end = 0;  // tokens so far; where the previous sequence ends (bytes)
  for (std::int64_t i = 0; i < num_sequences_; i++) {
    const std::int64_t n = sequence_size(i), ptr = sequence_pointer(i);
    if (n < 0 || ptr < 0 || ptr > bin_size || n > (bin_size - ptr) / esize) {
      return absl::InvalidArgumentError(
          absl::StrCat(bin_path, ": sequence ", i, " (", n, " tokens at byte ", ptr,
                       ") lies outside the file of ", bin_size_, " bytes"));
    }
    if (i == 0 && ptr != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix_, ".idx: sequence 0 starts at byte ", ptr, ", not at 0"));
    }
    if (ptr != end) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix_, ".idx: sequence ", i, " starts at byte ", ptr, " but sequence ", i - 1,
          " ends at byte ", end, " (", sequence_size(i - 1), " tokens of ", esize, " bytes, dtype ",
          static_cast<int>(dtype_), "): ", width_hint(i - 1, ptr)));
    }
    starts_.push_back(pos);
    pos += n;
    end = ptr + n * esize;
  }
  starts_.push_back(pos);
  total_tokens_ = pos;
  if (end != bin_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        bin_path, ": ", bin_size_, " bytes, but the index's ", num_sequences_, " sequences of ",
        pos, " tokens x ", esize, " bytes (dtype code ", static_cast<int>(dtype_), ") end at byte ",
        end, ": the dtype code disagrees with the .bin, or the .bin is not this index's"));
  }
  return absl::OkStatus();
}

// What a pointer mismatch after sequence i suggests: the bytes per token the
// pointers imply, when that is a whole width other than the dtype's.
std::string IndexedDataset::width_hint(std::int64_t i, std::int64_t next_ptr) const {
  const std::int64_t n = sequence_size(i), gap = next_ptr - sequence_pointer(i);
  if (n > 0 && gap > 0 && gap % n == 0 &&
      gap / n != static_cast<std::int64_t>(token_size(dtype_))) {
    return absl::StrCat("the pointers advance ", gap / n,
                        " bytes per token: the dtype code disagrees with the .bin");
  }
  return "the pointers do not follow the sizes";
}

// D entries, from 0 to S, never decreasing (repeats are documents without
// sequences, which Megatron writes for empty texts).
absl::Status IndexedDataset::check_documents() const {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, ".idx: ", what));
  };
  if (document_index(0) != 0) return bad("document index does not start with 0");
  if (document_index(num_doc_idx_ - 1) != num_sequences_) {
    return bad(absl::StrCat("document index ends at ", document_index(num_doc_idx_ - 1),
                            ", not at the ", num_sequences_, " sequences"));
  }
  for (std::int64_t k = 1; k < num_doc_idx_; k++) {
    if (document_index(k) < document_index(k - 1) || document_index(k) > num_sequences_) {
      return bad(absl::StrCat("document index ", k, " = ", document_index(k), " is out of order"));
    }
  }
  return absl::OkStatus();
}

std::int32_t IndexedDataset::sequence_size(std::int64_t i) const {
  return read_le<std::int32_t>(sizes_ + 4 * i);
}
std::int64_t IndexedDataset::sequence_pointer(std::int64_t i) const {
  return read_le<std::int64_t>(pointers_ + 8 * i);
}
std::int64_t IndexedDataset::document_index(std::int64_t k) const {
  return read_le<std::int64_t>(doc_idx_ + 8 * k);
}

std::pair<std::int64_t, std::int64_t> IndexedDataset::locate(std::int64_t position) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), position);
  const std::int64_t seq = (it - starts_.begin()) - 1;
  return {seq, position - starts_[static_cast<std::size_t>(seq)]};
}

absl::Status IndexedDataset::read(std::int64_t position, std::span<std::int32_t> out) const {
  const std::int64_t n = static_cast<std::int64_t>(out.size());
  if (position < 0 || position + n > total_tokens_) {
    return absl::OutOfRangeError(absl::StrCat(prefix_, ".bin: tokens [", position, ", ",
                                              position + n, ") past the end (", total_tokens_,
                                              " tokens)"));
  }
  std::size_t done = 0;
  auto [seq, off] = locate(position);
  const std::size_t esize = token_size(dtype_);
  while (done < out.size()) {
    const std::int64_t take =
        std::min<std::int64_t>(sequence_size(seq) - off, n - static_cast<std::int64_t>(done));
    const char* src = bin_ + sequence_pointer(seq) + off * static_cast<std::int64_t>(esize);
    for (std::int64_t i = 0; i < take; i++) {
      const char* e = src + i * static_cast<std::int64_t>(esize);
      std::int64_t v = 0;
      switch (dtype_) {
        case TokenDType::kU8:
          v = read_le<std::uint8_t>(e);
          break;
        case TokenDType::kI8:
          v = read_le<std::int8_t>(e);
          break;
        case TokenDType::kI16:
          v = read_le<std::int16_t>(e);
          break;
        case TokenDType::kU16:
          v = read_le<std::uint16_t>(e);
          break;
        case TokenDType::kI32:
          v = read_le<std::int32_t>(e);
          break;
        case TokenDType::kI64:
          v = read_le<std::int64_t>(e);
          break;
        default:
          break;
      }
      if (v < INT32_MIN || v > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix_, ".bin: token id ", v, " at position ",
                         position + static_cast<std::int64_t>(done) + i, " does not fit 32 bits"));
      }
      out[done + static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v);
    }
    done += static_cast<std::size_t>(take);
    seq++;
    off = 0;
  }
  return absl::OkStatus();
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() = default;  // an unfinished .bin is removed

absl::Status IndexedDatasetBuilder::open(const std::string& prefix, TokenDType dtype) {
  if (dtype != TokenDType::kU16 && dtype != TokenDType::kI32) {
    return absl::InvalidArgumentError("indexed dataset: tokens are written as u16 or i32");
  }
  prefix_ = prefix;
  dtype_ = dtype;
  absl::StatusOr<AtomicFile> bin = AtomicFile::create(prefix + ".bin");
  if (!bin.ok()) return bin.status();
  bin_ = std::make_unique<AtomicFile>(*std::move(bin));
  return absl::OkStatus();
}

absl::Status IndexedDatasetBuilder::add_document(std::span<const std::int32_t> tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {  // the index's sizes are i32
    return absl::InvalidArgumentError(
        absl::StrCat(prefix_, ": a document of ", tokens.size(), " tokens (at most 2^31 - 1)"));
  }
  const std::size_t esize = token_size(dtype_);
  buffer_.resize(tokens.size() * esize);
  for (std::size_t i = 0; i < tokens.size(); i++) {
    const std::int32_t t = tokens[i];
    if (dtype_ == TokenDType::kU16) {
      if (t < 0 || t > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix_, ": token ", t, " does not fit u16"));
      }
      const std::uint16_t u = static_cast<std::uint16_t>(t);
      std::memcpy(buffer_.data() + 2 * i, &u, 2);
    } else {
      std::memcpy(buffer_.data() + 4 * i, &t, 4);
    }
  }
  if (bin_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(prefix_, ": not open"));
  if (!buffer_.empty()) {
    if (absl::Status st = bin_->write(buffer_.data(), buffer_.size()); !st.ok()) return st;
  }
  if (!tokens.empty()) {
    sizes_.push_back(static_cast<std::int32_t>(tokens.size()));
    pointers_.push_back(bytes_);
    bytes_ += static_cast<std::int64_t>(buffer_.size());
    tokens_ += static_cast<std::int64_t>(tokens.size());
  }
  doc_idx_.push_back(static_cast<std::int64_t>(sizes_.size()));
  return absl::OkStatus();
}

absl::Status IndexedDatasetBuilder::finish() {
  if (bin_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(prefix_, ": not open"));
  absl::StatusOr<AtomicFile> idx = AtomicFile::create(prefix_ + ".idx");
  if (!idx.ok()) return idx.status();
  absl::Status written;
  auto put = [&](const void* p, std::size_t n) {
    if (written.ok()) written = idx->write(p, n);
  };
  const std::uint64_t version = 1, S = sizes_.size(), D = doc_idx_.size();
  const std::uint8_t code = static_cast<std::uint8_t>(dtype_);
  put(kMagic, 9);
  put(&version, 8);
  put(&code, 1);
  put(&S, 8);
  put(&D, 8);
  put(sizes_.data(), sizes_.size() * 4);
  put(pointers_.data(), pointers_.size() * 8);
  put(doc_idx_.data(), doc_idx_.size() * 8);
  if (!written.ok()) return written;
  // The .bin first: a reader opens the .idx, which then finds its .bin.
  if (absl::Status st = bin_->commit(); !st.ok()) return st;
  bin_.reset();
  return idx->commit();
}

absl::Status write_indexed_dataset(const std::string& prefix,
                                   const std::vector<std::vector<std::int32_t>>& documents,
                                   TokenDType dtype) {
  IndexedDatasetBuilder b;
  absl::Status st = b.open(prefix, dtype);
  for (const auto& doc : documents) {
    if (!st.ok()) return st;
    st = b.add_document(doc);
  }
  if (!st.ok()) return st;
  return b.finish();
}

}  // namespace troupe::model::data
