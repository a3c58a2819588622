// Fuzzes the vocabulary and merges loaders (Gpt2Vocab::load: encoder.json or
// vocab.json, vocab.bpe or merges.txt).
//
// Input: u16 n, n bytes of the vocabulary JSON, then the merges text.
// Checks: a rejected pair has a message naming one of the files; with an
// accepted one, encoding valid UTF-8 gives ids inside the vocabulary that
// decode to the same text.
#include <cstdint>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/data/bpe.h"

using namespace troupe::model::data;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string vocab_path = troupe::fuzz::scratch_path("encoder.json");
  static const std::string merges_path = troupe::fuzz::scratch_path("vocab.bpe");
  auto [vocab_text, merges_text] = troupe::fuzz::split_two(data, size);
  troupe::fuzz::write_file(vocab_path, vocab_text);
  troupe::fuzz::write_file(merges_path, merges_text);
  auto vocab = Gpt2Vocab::load(vocab_path, merges_path);
  if (!vocab.ok()) {
    const absl::string_view m = vocab.status().message();
    FUZZ_CHECK(m.find(vocab_path) != m.npos || m.find(merges_path) != m.npos);
    return 0;
  }
  FUZZ_CHECK((*vocab)->size() >= 257 && (*vocab)->eod() >= 0 && (*vocab)->eod() < (*vocab)->size());
  BpeEncoder enc(**vocab);
  // Text from the vocabulary's own tokens too, so merges are exercised.
  std::string text = "Hello world, it's 2026: caf\u00e9 \U0001F600  \n\t<|endoftext|>";
  for (std::int32_t id = 0; id < (*vocab)->size() && text.size() < 4096; id += 7) {
    text += (*vocab)->token_bytes(id);
  }
  std::vector<std::int32_t> ids;
  absl::Status st = enc.encode(text, &ids);
  if (!st.ok()) {  // the vocabulary's tokens may hold bytes that are not UTF-8
    FUZZ_CHECK(absl::IsInvalidArgument(st));
    return 0;
  }
  for (std::int32_t id : ids) FUZZ_CHECK(id >= 0 && id < (*vocab)->size());
  auto back = (*vocab)->decode(ids);
  FUZZ_CHECK(back.ok() && *back == text);
  return 0;
}
