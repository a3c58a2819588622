// Megatron-LM's indexed dataset (MMIDIDX): a `.bin` of raw token ids and an
// `.idx` that says where each sequence lies.
//
//   .idx: 9-byte magic "MMIDIDX\0\0", u64 version (1), u8 dtype code
//         (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16),
//         u64 sequence count S, u64 document count D (documents + 1),
//         i32 sizes[S], i64 byte pointers[S] (the running sum of size x
//         the dtype's width, from 0), i64 document indices[D] (starting with
//         0; document k is sequences [doc[k], doc[k+1]): an empty document
//         repeats the entry).
//   .bin: the tokens of every sequence, back to back, nothing after.
//
//   absl::StatusOr<std::unique_ptr<IndexedDataset>> ds = IndexedDataset::open("data/pile");
//   std::vector<std::int32_t> t(n);
//   RETURN_IF_ERROR((*ds)->read(/*position=*/0, t));   // tokens of the concatenated stream
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/atomic_file.h"

namespace troupe::model::data {

enum class TokenDType : std::uint8_t {
  kU8 = 1,
  kI8 = 2,
  kI16 = 3,
  kI32 = 4,
  kI64 = 5,
  kF64 = 6,
  kF32 = 7,
  kU16 = 8
};

// u16 when the vocabulary fits below 65,500 ids, else i32 (as Megatron).
TokenDType token_dtype_for_vocab(std::int64_t vocab_size);

class IndexedDataset {
 public:
  // Maps PREFIX.idx and PREFIX.bin; checks the header, the index's size, that
  // the pointers advance by size x the dtype's width from byte 0 to the .bin's
  // end (a dtype code that disagrees with the .bin is named), and the document
  // index (repeated entries, documents without sequences, are allowed).
  // Zero-length sequences are allowed. Errors name the file and the problem.
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> open(const std::string& prefix);
  ~IndexedDataset();

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  std::int64_t num_sequences() const { return num_sequences_; }
  std::int64_t num_documents() const { return num_doc_idx_ - 1; }
  std::int64_t num_tokens() const { return total_tokens_; }
  // Fields of the index. The .idx lays them out unaligned (its header is 34
  // bytes), so they are read with memcpy, never through typed pointers.
  std::int32_t sequence_size(std::int64_t i) const;
  std::int64_t sequence_pointer(std::int64_t i) const;
  std::int64_t document_index(std::int64_t k) const;

  // Tokens [position, position + out.size()) of all sequences concatenated in
  // order. OutOfRange past the end.
  absl::Status read(std::int64_t position, std::span<std::int32_t> out) const;
  // The sequence and offset of a position in the concatenated stream.
  std::pair<std::int64_t, std::int64_t> locate(std::int64_t position) const;

 private:
  IndexedDataset() = default;
  absl::Status parse_header();
  absl::Status check_sequences();
  absl::Status check_documents() const;
  std::string width_hint(std::int64_t i, std::int64_t next_ptr) const;
  std::string prefix_;
  TokenDType dtype_ = TokenDType::kU16;
  const char* sizes_ = nullptr;     // i32[S], in the mapped .idx
  const char* pointers_ = nullptr;  // i64[S]
  const char* doc_idx_ = nullptr;   // i64[D]
  std::int64_t num_sequences_ = 0, num_doc_idx_ = 0;
  std::vector<std::int64_t> starts_;  // stream position of each sequence, + total
  std::int64_t total_tokens_ = 0;
  const char* bin_ = nullptr;
  std::size_t bin_size_ = 0;
  const char* idx_ = nullptr;
  std::size_t idx_size_ = 0;
};

// Writes PREFIX.bin and PREFIX.idx document by document, one sequence per
// document (as Megatron's preprocess_data.py without sentence splitting). A
// document without tokens has no sequence: its entry repeats in the document
// index, as Megatron's IndexedDatasetBuilder.add_document(ids=[], lengths=[]).
// Both files are written under temporary names and renamed by finish(), so a
// reader never sees a half-written dataset.
//
//   IndexedDatasetBuilder b;
//   RETURN_IF_ERROR(b.open("out/pile_text_document", TokenDType::kU16));
//   RETURN_IF_ERROR(b.add_document(ids));
//   RETURN_IF_ERROR(b.finish());
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder() = default;
  ~IndexedDatasetBuilder();  // an unfinished dataset's temporary files are removed
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  absl::Status open(const std::string& prefix, TokenDType dtype);  // u16 or i32
  absl::Status add_document(std::span<const std::int32_t> tokens);
  absl::Status finish();
  std::int64_t documents() const { return static_cast<std::int64_t>(doc_idx_.size()) - 1; }
  std::int64_t tokens() const { return tokens_; }

 private:
  std::string prefix_;
  TokenDType dtype_ = TokenDType::kU16;
  std::unique_ptr<AtomicFile> bin_;  // the .bin being written
  std::vector<std::int32_t> sizes_;
  std::vector<std::int64_t> pointers_;
  std::vector<std::int64_t> doc_idx_{0};  // documents + 1: where each one's sequences start
  std::int64_t bytes_ = 0, tokens_ = 0;
  std::vector<char> buffer_;
};

// All documents at once through IndexedDatasetBuilder.
absl::Status write_indexed_dataset(const std::string& prefix,
                                   const std::vector<std::vector<std::int32_t>>& documents,
                                   TokenDType dtype);

}  // namespace troupe::model::data
