// GPT-2 byte-level BPE: vocabulary loading, PCRE2 pre-tokenization, merges.
#include "model/data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace troupe::model::data {

// GPT-2's pattern (tiktoken's `gpt2` pat_str) with \s spelled as Unicode's
// White_Space property, as Rust's regex reads \s.
constexpr char kPattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\p{White_Space}\\p{L}\\p{N}]+"
    "|\\p{White_Space}+(?!\\P{White_Space})|\\p{White_Space}+";

class Pretokenizer {
 public:
  Pretokenizer() {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code_ != nullptr) jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pretokenizer() { pcre2_code_free(code_); }
  pcre2_code* code() const { return code_; }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

namespace {

// GPT-2's map from bytes to the printable characters its vocabulary files
// use: printable Latin-1 bytes stand for themselves, the rest are shifted to
// U+0100 onwards in byte order.
std::array<std::string, 256> byte_to_unicode() {
  std::array<std::string, 256> out;
  int shifted = 0;
  for (int b = 0; b < 256; b++) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : 256u + shifted++;
    std::string s;  // UTF-8 of cp (< 0x800)
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    out[static_cast<std::size_t>(b)] = s;
  }
  return out;
}

// Inverse: a vocabulary string -> its bytes, or false if it uses a character
// outside the map.
bool unicode_to_bytes(const absl::flat_hash_map<std::string, std::uint8_t>& inv,
                      const std::string& s, std::string* out) {
  out->clear();
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = (static_cast<unsigned char>(s[i]) < 0x80) ? 1 : 2;
    auto it = inv.find(s.substr(i, len));
    if (it == inv.end()) return false;
    out->push_back(static_cast<char>(it->second));
    i += len;
  }
  return true;
}

absl::StatusOr<std::string> read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot open file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
         static_cast<std::uint32_t>(b);
}

}  // namespace

Gpt2Vocab::Gpt2Vocab() : pretokenizer_(std::make_unique<Pretokenizer>()) {}
Gpt2Vocab::~Gpt2Vocab() = default;

absl::StatusOr<std::unique_ptr<Gpt2Vocab>> Gpt2Vocab::load(const std::string& vocab_path,
                                                           const std::string& merges_path) {
  std::unique_ptr<Gpt2Vocab> v(new Gpt2Vocab());
  if (v->pretokenizer_->code() == nullptr) {
    return absl::InternalError("the GPT-2 pre-tokenization pattern did not compile in PCRE2");
  }
  auto vocab_text = read_file(vocab_path, "vocabulary");
  if (!vocab_text.ok()) return vocab_text.status();
  nlohmann::json j = nlohmann::json::parse(*vocab_text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabulary ", vocab_path, ": not a JSON object of token -> id"));
  }
  const auto b2u = byte_to_unicode();
  absl::flat_hash_map<std::string, std::uint8_t> u2b;
  for (int b = 0; b < 256; b++)
    u2b[b2u[static_cast<std::size_t>(b)]] = static_cast<std::uint8_t>(b);
  absl::flat_hash_map<std::string, std::int32_t> ids;  // vocabulary string -> id
  v->bytes_.resize(j.size());
  std::vector<bool> seen(j.size(), false);
  for (auto& [token, id_json] : j.items()) {
    if (!id_json.is_number_integer() || id_json.get<std::int64_t>() < 0 ||
        id_json.get<std::int64_t>() >= static_cast<std::int64_t>(j.size())) {
      return absl::InvalidArgumentError(absl::StrCat("vocabulary ", vocab_path, ": token '", token,
                                                     "' has an id outside [0, ", j.size(), ")"));
    }
    const auto id = id_json.get<std::int32_t>();
    if (seen[static_cast<std::size_t>(id)]) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocabulary ", vocab_path, ": id ", id, " appears twice"));
    }
    seen[static_cast<std::size_t>(id)] = true;
    ids[token] = id;
    if (token == "<|endoftext|>") {
      v->eod_ = id;
      v->bytes_[static_cast<std::size_t>(id)] = token;
    } else if (!unicode_to_bytes(u2b, token, &v->bytes_[static_cast<std::size_t>(id)])) {
      return absl::InvalidArgumentError(absl::StrCat("vocabulary ", vocab_path, ": token '", token,
                                                     "' is not in GPT-2's byte-level alphabet"));
    }
  }
  for (int b = 0; b < 256; b++) {
    auto it = ids.find(b2u[static_cast<std::size_t>(b)]);
    if (it == ids.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocabulary ", vocab_path, ": no token for byte ", b));
    }
    v->byte_token_[b] = it->second;
  }
  if (v->eod_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabulary ", vocab_path, ": no <|endoftext|> token"));
  }

  auto merges_text = read_file(merges_path, "merges");
  if (!merges_text.ok()) return merges_text.status();
  std::istringstream lines(*merges_text);
  std::string line;
  std::int32_t rank = 0;
  for (int lineno = 1; std::getline(lines, line); lineno++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const std::size_t sp = line.find(' ');
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("merges ", merges_path, ":", lineno, ": ", why));
    };
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
      return bad("want two tokens separated by one space");
    }
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    auto ia = ids.find(a), ib = ids.find(b), iab = ids.find(a + b);
    if (ia == ids.end() || ib == ids.end() || iab == ids.end()) {
      return bad(absl::StrCat("'", a, "' + '", b, "' names a token not in the vocabulary"));
    }
    v->merges_.try_emplace(pair_key(ia->second, ib->second), rank++, iab->second);
  }
  if (rank == 0)
    return absl::InvalidArgumentError(absl::StrCat("merges ", merges_path, ": no merges"));
  return v;
}

absl::StatusOr<std::string> Gpt2Vocab::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); i++) {
    if (ids[i] < 0 || ids[i] >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("decode: id ", ids[i], " at position ", i, " is outside [0, ", size(), ")"));
    }
    out += bytes_[static_cast<std::size_t>(ids[i])];
  }
  return out;
}

BpeEncoder::BpeEncoder(const Gpt2Vocab& vocab)
    : vocab_(vocab),
      match_data_(pcre2_match_data_create_from_pattern(vocab.pretokenizer_->code(), nullptr)) {}

BpeEncoder::~BpeEncoder() { pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_)); }

// Walks the pre-tokenizer's matches; `fn(piece)` for each. The first match
// validates the UTF-8 of the whole text; later ones skip that check.
template <typename F>
static absl::Status for_each_piece(pcre2_code* code, pcre2_match_data* md, absl::string_view text,
                                   F&& fn) {
  const auto* s = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE pos = 0;
  std::uint32_t options = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, s, text.size(), pos, options, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen: \p{White_Space}+|... cover all
    if (rc < 0) {
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
        return absl::InvalidArgumentError(
            absl::StrCat("text is not valid UTF-8 at byte ", pcre2_get_startchar(md)));
      }
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return absl::InternalError(absl::StrCat("pre-tokenizer: ", reinterpret_cast<char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    fn(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
    options = PCRE2_NO_UTF_CHECK;
  }
  return absl::OkStatus();
}

absl::Status BpeEncoder::encode(absl::string_view text, std::vector<std::int32_t>* ids) {
  return for_each_piece(vocab_.pretokenizer_->code(), static_cast<pcre2_match_data*>(match_data_),
                        text, [&](absl::string_view piece) { encode_piece(piece, ids); });
}

absl::StatusOr<std::vector<std::string>> BpeEncoder::pieces(absl::string_view text) {
  std::vector<std::string> out;
  absl::Status st =
      for_each_piece(vocab_.pretokenizer_->code(), static_cast<pcre2_match_data*>(match_data_),
                     text, [&](absl::string_view p) { out.emplace_back(p); });
  if (!st.ok()) return st;
  return out;
}

// Byte-level BPE of one piece: start from one token per byte and merge the
// adjacent pair of lowest rank (the leftmost of equal ranks) until no pair
// has a rank, as tiktoken. The candidate pairs wait in a min-heap of (rank,
// position of the left token) and the tokens form a linked list, so a piece
// of n bytes costs O(n log n): rescanning the piece for each merge, as
// before, took minutes for a megabyte-long word.
void BpeEncoder::encode_piece(absl::string_view piece, std::vector<std::int32_t>* ids) {
  if (piece.size() == 1) {
    ids->push_back(vocab_.byte_token_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  auto hit = cache_.find(piece);
  if (hit != cache_.end()) {
    ids->insert(ids->end(), hit->second.begin(), hit->second.end());
    return;
  }
  const auto n = static_cast<std::int32_t>(piece.size());
  std::vector<std::int32_t>& tok = work_;  // tok[i]: the token starting at byte i (-1: merged away)
  tok.resize(piece.size());
  next_.resize(piece.size());
  prev_.resize(piece.size());
  for (std::int32_t i = 0; i < n; i++) {
    tok[i] = vocab_.byte_token_[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])];
    next_[i] = i + 1;  // n: none
    prev_[i] = i - 1;  // -1: none
  }
  // (rank, left position, left token, right token, merged token), smallest first.
  using Candidate = std::array<std::int32_t, 5>;
  std::vector<Candidate>& heap = heap_;
  heap.clear();
  auto push = [&](std::int32_t left) {
    const std::int32_t right = next_[left];
    if (left < 0 || right >= n) return;
    auto it = vocab_.merges_.find(pair_key(tok[left], tok[right]));
    if (it == vocab_.merges_.end()) return;
    heap.push_back({it->second.first, left, tok[left], tok[right], it->second.second});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (std::int32_t i = 0; i + 1 < n; i++) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const auto [rank, left, left_tok, right_tok, merged] = heap.back();
    heap.pop_back();
    const std::int32_t right = next_[left];
    // Stale: the left token was merged into its neighbour or changed, or its
    // right neighbour is not the one this pair was made with.
    if (tok[left] != left_tok || right >= n || tok[right] != right_tok) continue;
    tok[left] = merged;
    tok[right] = -1;
    next_[left] = next_[right];
    if (next_[right] < n) prev_[next_[right]] = left;
    if (prev_[left] >= 0) push(prev_[left]);
    push(left);
  }
  std::vector<std::int32_t> out;
  for (std::int32_t i = 0; i < n; i = next_[i]) out.push_back(tok[i]);
  ids->insert(ids->end(), out.begin(), out.end());
  if (cache_.size() >= (1u << 18)) cache_.clear();  // bounded memory on endless new pieces
  cache_.emplace(std::string(piece), std::move(out));
}

}  // namespace troupe::model::data
