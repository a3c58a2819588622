// GPT-2's byte-level BPE tokenizer, identical in its ids to tiktoken's `gpt2`
// encoding (Python/Rust tiktoken; "<|endoftext|>" in raw text is ordinary
// text).
//
// Pre-tokenization uses GPT-2's pattern with real Unicode properties from
// PCRE2 (\p{L}, \p{N}, \p{White_Space}, JIT-compiled); each piece is then
// merged by the BPE ranks from vocab.bpe/merges.txt, with a cache of pieces
// already seen.
//
//   auto vocab = data::Gpt2Vocab::load("encoder.json", "vocab.bpe");
//   data::BpeEncoder enc(**vocab);          // one per thread: owns its cache
//   std::vector<std::int32_t> ids;
//   RETURN_IF_ERROR(enc.encode("Hello world", &ids));    // appends [15496, 995]
//   absl::StatusOr<std::string> text = (*vocab)->decode(ids);
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe::model::data {

class Pretokenizer;

// The vocabulary and merges; immutable once loaded and shared by encoders.
class Gpt2Vocab {
 public:
  // encoder.json + vocab.bpe (OpenAI's names) or vocab.json + merges.txt
  // (Hugging Face's): the same formats. Errors name the file and line.
  static absl::StatusOr<std::unique_ptr<Gpt2Vocab>> load(const std::string& vocab_path,
                                                         const std::string& merges_path);
  ~Gpt2Vocab();

  int size() const { return static_cast<int>(bytes_.size()); }
  // The id of "<|endoftext|>" (50256 for GPT-2).
  std::int32_t eod() const { return eod_; }
  // Bytes of the ids, concatenated; InvalidArgument for an id out of range.
  absl::StatusOr<std::string> decode(std::span<const std::int32_t> ids) const;
  const std::string& token_bytes(std::int32_t id) const {
    return bytes_[static_cast<std::size_t>(id)];
  }

 private:
  friend class BpeEncoder;
  Gpt2Vocab();
  std::vector<std::string> bytes_;     // id -> bytes
  std::int32_t byte_token_[256] = {};  // byte -> id of its one-byte token
  // (left id, right id) -> (merge rank, merged id)
  absl::flat_hash_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  std::int32_t eod_ = -1;
  std::unique_ptr<Pretokenizer> pretokenizer_;
};

// Encodes text; not thread-safe (one per thread), cheap to make.
class BpeEncoder {
 public:
  explicit BpeEncoder(const Gpt2Vocab& vocab);
  ~BpeEncoder();
  BpeEncoder(const BpeEncoder&) = delete;
  BpeEncoder& operator=(const BpeEncoder&) = delete;

  // Appends the ids of `text` to `ids`. InvalidArgument if `text` is not
  // valid UTF-8 (naming the byte offset).
  absl::Status encode(absl::string_view text, std::vector<std::int32_t>* ids);
  // The pre-tokenizer's pieces (for tests and debugging).
  absl::StatusOr<std::vector<std::string>> pieces(absl::string_view text);

 private:
  void encode_piece(absl::string_view piece, std::vector<std::int32_t>* ids);

  const Gpt2Vocab& vocab_;
  void* match_data_;  // pcre2_match_data_8
  absl::flat_hash_map<std::string, std::vector<std::int32_t>> cache_;
  // encode_piece's scratch, kept between pieces: tokens, links, the heap.
  std::vector<std::int32_t> work_, next_, prev_;
  std::vector<std::array<std::int32_t, 5>> heap_;
};

}  // namespace troupe::model::data
