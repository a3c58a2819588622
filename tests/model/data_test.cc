// Megatron indexed datasets and the sample loader.
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <set>

#include "model/data/indexed_dataset.h"
#include "model/data/loader.h"
#include "model/data/synthetic.h"

namespace troupe::model::data {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The .idx of three documents [5 tokens, 2, 3] as Megatron-LM's
// indexed_dataset.py writes it, spelled out field by field.
TEST(IndexedDataset, WritesMegatronBytes) {
  const std::string prefix = ::testing::TempDir() + "/troupe_three_docs";
  std::vector<std::vector<std::int32_t>> docs = {{1, 2, 3, 4, 5}, {6, 7}, {8, 9, 10}};
  ASSERT_TRUE(write_indexed_dataset(prefix, docs, TokenDType::kU16).ok());
  std::string want("MMIDIDX\0\0", 9);
  put<std::uint64_t>(want, 1);                       // version
  put<std::uint8_t>(want, 8);                        // dtype code: u16
  put<std::uint64_t>(want, 3);                       // sequences
  put<std::uint64_t>(want, 4);                       // document indices (documents + 1)
  for (std::int32_t n : {5, 2, 3}) put(want, n);     // sizes
  for (std::int64_t p : {0, 10, 14}) put(want, p);   // byte pointers
  for (std::int64_t d : {0, 1, 2, 3}) put(want, d);  // document index
  EXPECT_EQ(read_file(prefix + ".idx"), want);
  std::string bin;
  for (int t = 1; t <= 10; t++) put<std::uint16_t>(bin, static_cast<std::uint16_t>(t));
  EXPECT_EQ(read_file(prefix + ".bin"), bin);

  auto ds = IndexedDataset::open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_documents(), 3);
  EXPECT_EQ((*ds)->num_tokens(), 10);
  std::vector<std::int32_t> got(6);
  ASSERT_TRUE((*ds)->read(3, got).ok());  // across documents
  EXPECT_EQ(got, (std::vector<std::int32_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_TRUE(absl::IsOutOfRange((*ds)->read(8, got)));
}

TEST(IndexedDataset, RejectsBadFiles) {
  const std::string prefix = ::testing::TempDir() + "/troupe_bad_ds";
  ASSERT_TRUE(write_indexed_dataset(prefix, {{1, 2, 3}}, TokenDType::kI32).ok());
  std::string idx = read_file(prefix + ".idx");
  std::ofstream(prefix + ".idx", std::ios::binary).write(idx.data(), static_cast<std::streamsize>(idx.size() - 4));
  auto ds = IndexedDataset::open(prefix);
  EXPECT_TRUE(absl::IsInvalidArgument(ds.status()));
  EXPECT_NE(ds.status().message().find(prefix + ".idx"), absl::string_view::npos);
  // A .bin shorter than the pointers say.
  ASSERT_TRUE(write_indexed_dataset(prefix, {{1, 2, 3}}, TokenDType::kI32).ok());
  std::ofstream(prefix + ".bin", std::ios::binary).write("\0\0\0\0", 4);
  ds = IndexedDataset::open(prefix);
  EXPECT_NE(ds.status().message().find("lies outside"), absl::string_view::npos) << ds.status();
  EXPECT_TRUE(absl::IsNotFound(IndexedDataset::open(prefix + "_missing").status()));
}

TEST(Loader, NoShuffleSamplesAreConsecutiveWindows) {
  std::vector<std::int32_t> stream(100);
  std::iota(stream.begin(), stream.end(), 0);
  auto loader = GptLoader::create(memory_source("mem", stream), {.T = 8, .V = 100, .shuffle = false});
  ASSERT_TRUE(loader.ok());
  EXPECT_EQ((*loader)->num_samples(), 12);  // (100 - 1) / 8
  std::vector<std::int32_t> tok(8), tgt(8);
  ASSERT_TRUE((*loader)->sample(3, tok, tgt).ok());
  for (int i = 0; i < 8; i++) {
    EXPECT_EQ(tok[i], 24 + i);
    EXPECT_EQ(tgt[i], 25 + i);
  }
  ASSERT_TRUE((*loader)->sample(12, tok, tgt).ok());  // next epoch starts over
  EXPECT_EQ(tok[0], 0);
}

TEST(Loader, TokenOutsideVocabularyNamesFileAndPosition) {
  const std::string prefix = ::testing::TempDir() + "/troupe_big_token";
  ASSERT_TRUE(write_indexed_dataset(prefix, {{1, 2, 3}, {4, 700, 5, 6}}, TokenDType::kU16).ok());
  auto src = open_indexed_source(prefix);
  ASSERT_TRUE(src.ok());
  auto loader = GptLoader::create(std::move(*src), {.T = 4, .V = 512, .shuffle = false});
  ASSERT_TRUE(loader.ok());
  std::vector<std::int32_t> tok(4), tgt(4);
  absl::Status st = (*loader)->sample(0, tok, tgt);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_EQ(st.message(), prefix + ".bin: token id 700 at position 4 is outside the vocabulary [0, 512)");
}

TEST(Loader, TooFewTokensIsAnError) {
  auto loader = GptLoader::create(memory_source("tiny.bin", {1, 2, 3}), {.T = 8, .V = 10});
  EXPECT_TRUE(absl::IsInvalidArgument(loader.status()));
  EXPECT_NE(loader.status().message().find("tiny.bin"), absl::string_view::npos);
}

TEST(Loader, ShuffleIsAPermutationFixedBySeedAndEpoch) {
  auto p = shuffled_indices(1000, 7, 0);
  EXPECT_EQ(std::set<std::int64_t>(p.begin(), p.end()).size(), 1000u);
  EXPECT_EQ(p, shuffled_indices(1000, 7, 0));
  EXPECT_NE(p, shuffled_indices(1000, 7, 1));
  EXPECT_NE(p, shuffled_indices(1000, 8, 0));
}

TEST(Synthetic, PhraseCorpusIsDeterministicAndInRange) {
  PhraseCorpusOptions o{.vocab_size = 50, .num_tokens = 5000, .seed = 3};
  auto a = phrase_corpus(o), b = phrase_corpus(o);
  EXPECT_EQ(a, b);
  std::int64_t n = 0;
  for (const auto& d : a) {
    EXPECT_EQ(d.back(), 0);
    for (std::int32_t t : d) EXPECT_TRUE(t >= 0 && t < 50);
    n += static_cast<std::int64_t>(d.size());
  }
  EXPECT_GE(n, 5000);
}

}  // namespace
}  // namespace troupe::model::data
