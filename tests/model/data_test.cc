// Megatron indexed datasets and the sample loader.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "model/data/datasets.h"
#include "model/data/gpt_dataset.h"
#include "model/data/indexed_dataset.h"
#include "model/data/synthetic.h"
#include "model/safetensors.h"

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
  std::ofstream(prefix + ".idx", std::ios::binary)
      .write(idx.data(), static_cast<std::streamsize>(idx.size() - 4));
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

using Range = std::pair<std::int64_t, std::int64_t>;

SampleSpec spec(int T, int V, bool shuffle, std::string cache = "") {
  return {.T = T, .V = V, .seed = 7, .shuffle = shuffle, .cache_dir = std::move(cache)};
}

std::vector<std::int32_t> sample_of(const SampleSource& s, std::int64_t i, int T) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(T) + 1);
  absl::Status st = s.sample(i, out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// Fixtures written by Megatron-LM's own code at commit
// d98e8a64ddf34856e74b24714e3bedb2f5a39553 (tests/reference/data/
// megatron_commit.txt; tests/reference/make_megatron_data_fixture.py).
const std::string kMegatron = TROUPE_SOURCE_DIR "/tests/reference/data/";

// Megatron's add_document(ids=[], lengths=[]) (an empty text): no sequence,
// the document index repeats. Hand-derived from the format.
TEST(IndexedDataset, EmptyDocumentRepeatsTheDocumentIndex) {
  const std::string prefix = ::testing::TempDir() + "/troupe_empty_doc";
  ASSERT_TRUE(write_indexed_dataset(prefix, {{}, {1, 2}, {}, {}, {3}, {}}, TokenDType::kU16).ok());
  std::string want("MMIDIDX\0\0", 9);
  put<std::uint64_t>(want, 1);
  put<std::uint8_t>(want, 8);
  put<std::uint64_t>(want, 2);                                // sequences
  put<std::uint64_t>(want, 7);                                // documents + 1
  for (std::int32_t n : {2, 1}) put(want, n);                 // sizes
  for (std::int64_t p : {0, 4}) put(want, p);                 // byte pointers
  for (std::int64_t d : {0, 0, 1, 1, 1, 2, 2}) put(want, d);  // document index
  EXPECT_EQ(read_file(prefix + ".idx"), want);
  auto ds = IndexedDataset::open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_documents(), 6);
  EXPECT_EQ((*ds)->num_sequences(), 2);
}

// Megatron's add_item of an empty tensor writes a zero-length sequence; an
// end_document with no item a document without sequences.
TEST(IndexedDataset, ReadsMegatronsZeroLengthSequences) {
  auto ds = IndexedDataset::open(kMegatron + "megatron_zero_length");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_sequences(), 4);  // 3, 0, 0, 2 tokens
  EXPECT_EQ((*ds)->num_documents(), 4);  // [3, 0], [], [0], [2]
  std::vector<std::int64_t> doc_idx;
  for (std::int64_t k = 0; k <= (*ds)->num_documents(); k++)
    doc_idx.push_back((*ds)->document_index(k));
  EXPECT_EQ(doc_idx, (std::vector<std::int64_t>{0, 2, 2, 3, 4}));
  std::vector<std::int32_t> got(5);
  ASSERT_TRUE((*ds)->read(0, got).ok());
  EXPECT_EQ(got, (std::vector<std::int32_t>{7, 8, 9, 10, 11}));
  // Samples across the empty sequences: T = 2, file order.
  auto src = open_indexed_documents(kMegatron + "megatron_zero_length");
  ASSERT_TRUE(src.ok()) << src.status();
  auto gd = GptDataset::build(*src, {0, 4}, spec(2, 20, false), 2, "train");
  ASSERT_TRUE(gd.ok()) << gd.status();
  std::vector<std::int32_t> sample(3);
  ASSERT_TRUE((*gd)->sample(1, sample).ok());
  EXPECT_EQ(sample, (std::vector<std::int32_t>{9, 10, 11}));
  EXPECT_EQ((*gd)->sample_start(1), (std::pair<std::int64_t, std::int64_t>{0, 2}));
}

// An .idx whose dtype code disagrees with its .bin: the pointers advance by
// another width than the code's, or the sequences do not end at the .bin's end.
TEST(IndexedDataset, DtypeCodeThatDisagreesWithTheBinIsNamed) {
  const std::string prefix = ::testing::TempDir() + "/troupe_wrong_dtype";
  auto open_with_code = [&](std::vector<std::vector<std::int32_t>> docs, TokenDType written,
                            std::uint8_t code) {
    EXPECT_TRUE(write_indexed_dataset(prefix, docs, written).ok());
    std::string idx = read_file(prefix + ".idx");
    idx[17] = static_cast<char>(code);
    std::ofstream(prefix + ".idx", std::ios::binary | std::ios::trunc) << idx;
    return IndexedDataset::open(prefix).status();
  };
  absl::Status st = open_with_code({{1, 2, 3, 4, 5}, {6, 7}}, TokenDType::kU16, 1);  // u8 code
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_EQ(st.message(), prefix +
                              ".idx: sequence 1 starts at byte 10 but sequence 0 ends at byte 5 (5 "
                              "tokens of 1 bytes, dtype 1): the pointers advance 2 bytes per "
                              "token: the dtype code disagrees with the .bin");
  st = open_with_code({{1, 2}, {3}}, TokenDType::kI32, 8);  // u16 code on i32 data
  EXPECT_NE(st.message().find("advance 4 bytes per token"), absl::string_view::npos) << st;
  // One sequence: no second pointer, but the .bin is longer than it says.
  st = open_with_code({{1, 2, 3}}, TokenDType::kU16, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find(prefix + ".bin: 6 bytes, but the index's 1 sequences of 3 tokens x 1 "
                                       "bytes (dtype code 1) end at byte 3"),
            absl::string_view::npos)
      << st;
  // The right code opens.
  EXPECT_TRUE(open_with_code({{1, 2, 3}}, TokenDType::kU16, 8).ok());
}

TEST(Split, RangesAsMegatron) {
  auto r = parse_split("969,30,1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->range(Split::kTrain, 1000), (Range{0, 969}));
  EXPECT_EQ(r->range(Split::kValid, 1000), (Range{969, 999}));
  EXPECT_EQ(r->range(Split::kTest, 1000), (Range{999, 1000}));
  r = parse_split("1/1/1");  // 7 documents: 2.33 each rounds to 2; the last absorbs the rest
  EXPECT_EQ(r->range(Split::kTrain, 7), (Range{0, 3}));
  EXPECT_EQ(r->range(Split::kValid, 7), (Range{3, 5}));
  EXPECT_EQ(r->range(Split::kTest, 7), (Range{5, 7}));
  EXPECT_TRUE(absl::IsInvalidArgument(parse_split("a,b").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(parse_split("0,0,0").status()));
}

TEST(GptDataset, NoShuffleSamplesAreConsecutiveWindowsAcrossDocuments) {
  std::vector<std::vector<std::int32_t>> docs;
  for (int d = 0; d < 10; d++) {
    docs.emplace_back();
    for (int k = 0; k < 10; k++) docs.back().push_back(d * 10 + k);
  }
  auto ds =
      GptDataset::build(memory_documents("mem", docs), {0, 10}, spec(8, 100, false), 12, "train");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->epochs(), 1);
  for (int i : {0, 3, 11}) {
    auto s = sample_of(**ds, i, 8);
    for (int k = 0; k <= 8; k++) EXPECT_EQ(s[k], i * 8 + k);
  }
  // More samples than one epoch holds: documents repeat.
  ds = GptDataset::build(memory_documents("mem", docs), {0, 10}, spec(8, 100, false), 30, "train");
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->epochs(), 3);
  auto s = sample_of(**ds, 13, 8);  // tokens 104..112 of the repeated stream
  EXPECT_EQ(s[0], 4);
}

TEST(GptDataset, ShuffledSamplesArePermutedWindowsOfShuffledDocuments) {
  std::vector<std::vector<std::int32_t>> docs(20, std::vector<std::int32_t>(16));
  for (int d = 0; d < 20; d++)
    for (int k = 0; k < 16; k++) docs[d][k] = d;  // a document is its id, 16 times
  auto a =
      GptDataset::build(memory_documents("mem", docs), {0, 20}, spec(16, 20, true), 19, "train");
  auto b =
      GptDataset::build(memory_documents("mem", docs), {0, 20}, spec(16, 20, true), 19, "train");
  ASSERT_TRUE(a.ok() && b.ok());
  std::set<std::int32_t> firsts;
  for (int i = 0; i < 19; i++) {
    EXPECT_EQ(sample_of(**a, i, 16), sample_of(**b, i, 16));  // deterministic
    firsts.insert(sample_of(**a, i, 16)[0]);
  }
  EXPECT_EQ(firsts.size(), 19u);  // each sample one whole (shuffled) document
  EXPECT_NE(sample_of(**a, 0, 16)[0], 0);
}

// The sample index of Megatron's helpers.cpp build_sample_idx (the fixture)
// on sequence lengths with zeros, file order; and each sample is the T+1
// tokens of the repeated stream from sample i * T (brute force).
TEST(GptDataset, SampleIndexIsMegatronsWithEmptyDocuments) {
  std::ifstream in(kMegatron + "megatron_sample_idx.txt");
  ASSERT_TRUE(in) << "missing fixture";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.rfind("case ", 0) != 0) continue;
    int T = 0, epochs = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "case T=%d epochs=%d", &T, &epochs), 2) << line;
    auto numbers = [&](const char* tag) {
      std::string l;
      std::getline(in, l);
      std::istringstream ss(l);
      std::string t;
      ss >> t;
      EXPECT_EQ(t, tag);
      std::vector<std::int64_t> v;
      for (std::int64_t x; ss >> x;) v.push_back(x);
      return v;
    };
    const std::vector<std::int64_t> sizes = numbers("sizes"), want = numbers("sample_idx");
    std::vector<std::vector<std::int32_t>> docs;
    std::vector<std::int32_t> stream;  // one epoch, concatenated
    for (std::int64_t n : sizes) {
      docs.emplace_back();
      for (std::int64_t k = 0; k < n; k++) {
        docs.back().push_back(static_cast<std::int32_t>(stream.size()));
        stream.push_back(static_cast<std::int32_t>(stream.size()));
      }
    }
    const std::int64_t num_samples = static_cast<std::int64_t>(want.size()) / 2 - 1;
    const auto n_docs = static_cast<std::int64_t>(docs.size());
    auto ds = GptDataset::build(memory_documents("mem", docs), {0, n_docs}, spec(T, 1000, false),
                                num_samples, "train");
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_LE((*ds)->epochs(), epochs);
    for (std::int64_t j = 0; j <= num_samples; j++) {
      EXPECT_EQ((*ds)->sample_start(j),
                (std::pair<std::int64_t, std::int64_t>{want[2 * j], want[2 * j + 1]}))
          << line << ", sample " << j;
    }
    for (std::int64_t i = 0; i < num_samples; i++) {
      auto s = sample_of(**ds, i, T);
      for (int k = 0; k <= T; k++) {
        EXPECT_EQ(s[k], stream[static_cast<std::size_t>(i * T + k) % stream.size()]) << line;
      }
    }
    cases++;
  }
  EXPECT_EQ(cases, 4);
}

TEST(GptDataset, TokenOutsideVocabularyNamesFileAndPosition) {
  const std::string prefix = ::testing::TempDir() + "/troupe_big_token";
  ASSERT_TRUE(write_indexed_dataset(prefix, {{1, 2, 3}, {4, 700, 5, 6}}, TokenDType::kU16).ok());
  auto src = open_indexed_documents(prefix);
  ASSERT_TRUE(src.ok());
  auto ds = GptDataset::build(*src, {0, 2}, spec(4, 512, false), 1, "train");
  ASSERT_TRUE(ds.ok());
  std::vector<std::int32_t> out(5);
  absl::Status st = (*ds)->sample(0, out);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_EQ(st.message(),
            prefix + ".bin: token id 700 at position 4 is outside the vocabulary [0, 512)");
}

TEST(GptDataset, IndicesAreCachedAndRebuiltWhenTheDataChanges) {
  const std::string dir = ::testing::TempDir() + "/troupe_cache_test";
  std::filesystem::remove_all(dir);
  const std::string prefix = ::testing::TempDir() + "/troupe_cached";
  std::vector<std::vector<std::int32_t>> docs;
  for (int d = 0; d < 50; d++) docs.push_back(std::vector<std::int32_t>(37, d));
  ASSERT_TRUE(write_indexed_dataset(prefix, docs, TokenDType::kU16).ok());
  auto build = [&] {
    auto src = open_indexed_documents(prefix);
    EXPECT_TRUE(src.ok());
    auto ds = GptDataset::build(*src, {0, 50}, spec(16, 100, true, dir), 100, "train");
    EXPECT_TRUE(ds.ok()) << ds.status();
    return std::move(*ds);
  };
  auto first = build();
  EXPECT_FALSE(first->from_cache());
  EXPECT_TRUE(std::filesystem::exists(first->cache_file()));
  auto second = build();
  EXPECT_TRUE(second->from_cache());
  for (int i = 0; i < 100; i += 7) EXPECT_EQ(sample_of(*first, i, 16), sample_of(*second, i, 16));
  // New contents (so a new fingerprint): the indices are built again.
  docs.push_back(std::vector<std::int32_t>(5, 99));
  ASSERT_TRUE(write_indexed_dataset(prefix, docs, TokenDType::kU16).ok());
  auto third = build();
  EXPECT_FALSE(third->from_cache());
  // A corrupt cache file is rebuilt, not trusted.
  std::ofstream(third->cache_file(), std::ios::binary | std::ios::trunc) << "junk";
  EXPECT_FALSE(build()->from_cache());
  // Truncated: rebuilt from scratch (a regression: the partly read indices
  // once stayed in front of the rebuilt ones and leaked other documents in).
  const std::string file = third->cache_file();
  const auto full = std::filesystem::file_size(file);
  std::filesystem::resize_file(file, 40);
  auto rebuilt = build();
  EXPECT_FALSE(rebuilt->from_cache());
  for (int i = 0; i < 100; i += 3)
    EXPECT_EQ(sample_of(*rebuilt, i, 16), sample_of(*third, i, 16)) << i;
  EXPECT_EQ(std::filesystem::file_size(file), full);
  // In range checks: a shuffle entry pointing far outside is rebuilt, not followed.
  {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(full - 8));
    const std::int64_t huge = std::int64_t{1} << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  auto checked = build();
  EXPECT_FALSE(checked->from_cache());
  EXPECT_EQ(sample_of(*checked, 99, 16), sample_of(*third, 99, 16));
}

// Found by fuzz/sample_cache_fuzz.cc: a cache file whose indices were all in
// range but not the ones built (a shuffle entry changed: another sample
// repeated in place of one) was trusted. Now a checksum guards the body, and
// indices that disagree with each other are rejected even with a checksum
// that matches (computed here: zlib's CRC-32 of the body).
TEST(GptDataset, CacheWithOtherIndicesIsRebuiltNotTrusted) {
  const std::string dir = ::testing::TempDir() + "/troupe_cache_forged";
  std::filesystem::remove_all(dir);
  std::vector<std::vector<std::int32_t>> docs = {{1, 2, 3, 4, 5}, {}, {6, 7, 8}, {9, 10, 11, 12}};
  auto build = [&] {
    auto ds = GptDataset::build(memory_documents("forged", docs), {0, 4}, spec(3, 20, true, dir), 4,
                                "train");
    EXPECT_TRUE(ds.ok()) << ds.status();
    return std::move(*ds);
  };
  auto fresh = build();
  const std::string file = fresh->cache_file();
  const std::string good = read_file(file);
  std::uint64_t n_doc = 0;  // 2 epochs of 4 documents: 12 tokens, 4 samples need 13
  std::memcpy(&n_doc, good.data() + 8, 8);
  ASSERT_EQ(n_doc, 8u);
  ASSERT_EQ(good.size(), 32u + 4 * n_doc + 5 * 16 + 4 * 8);  // header, doc_idx, starts, shuffle
  auto write_with = [&](std::size_t at, std::int64_t v, bool fix_checksum) {
    std::string f = good;
    std::memcpy(f.data() + at, &v, 8);
    if (fix_checksum) {
      const std::uint64_t h =
          ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(f.data() + 32),
                  static_cast<uInt>(f.size() - 32));
      std::memcpy(f.data() + 24, &h, 8);
    }
    std::ofstream(file, std::ios::binary | std::ios::trunc) << f;
  };
  std::int64_t first = 0;
  std::memcpy(&first, good.data() + good.size() - 32, 8);
  // The last shuffle entry repeats the first: in range, not a permutation.
  for (bool fix : {false, true}) {
    write_with(good.size() - 8, first, fix);
    auto ds = build();
    EXPECT_FALSE(ds->from_cache()) << fix;
    for (int i = 0; i < 4; i++) EXPECT_EQ(sample_of(*ds, i, 3), sample_of(*fresh, i, 3));
  }
  // Sample 1's offset changed (any start that is not 3 tokens after sample
  // 0's), with a checksum that matches.
  std::int64_t offset1 = 0;
  const std::size_t at = 32 + 4 * n_doc + 5 * 8 + 8;
  std::memcpy(&offset1, good.data() + at, 8);
  write_with(at, offset1 == 0 ? 1 : 0, true);
  EXPECT_FALSE(build()->from_cache());
  std::ofstream(file, std::ios::binary | std::ios::trunc) << good;
  EXPECT_TRUE(build()->from_cache());
}

TEST(Split, HalvesRoundToEvenAsPython) {
  auto r = parse_split("969,30,1");
  EXPECT_EQ(r->range(Split::kTrain, 500), (Range{0, 485}));
  EXPECT_EQ(r->range(Split::kValid, 500), (Range{485, 500}));
  EXPECT_EQ(r->range(Split::kTest, 500), (Range{500, 500}));
  r = parse_split("1,1");
  EXPECT_EQ(r->range(Split::kTrain, 5), (Range{0, 3}));
  EXPECT_EQ(r->range(Split::kValid, 5), (Range{3, 5}));
  r = parse_split("1,0,1");
  EXPECT_EQ(r->range(Split::kTrain, 1), (Range{0, 1}));
}

TEST(IndexedDataset, TokensThatDoNotFit32BitsAreAnError) {
  const std::string prefix = ::testing::TempDir() + "/troupe_i64";
  std::string idx("MMIDIDX\0\0", 9);
  put<std::uint64_t>(idx, 1);
  put<std::uint8_t>(idx, 5);  // i64
  put<std::uint64_t>(idx, 1);
  put<std::uint64_t>(idx, 2);
  put<std::int32_t>(idx, 2);
  put<std::int64_t>(idx, 0);
  put<std::int64_t>(idx, 0);
  put<std::int64_t>(idx, 1);
  std::string bin;
  put<std::int64_t>(bin, (std::int64_t{1} << 32) + 7);  // would wrap to 7
  put<std::int64_t>(bin, 3);
  std::ofstream(prefix + ".idx", std::ios::binary) << idx;
  std::ofstream(prefix + ".bin", std::ios::binary) << bin;
  auto ds = IndexedDataset::open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  std::vector<std::int32_t> out(2);
  absl::Status st = (*ds)->read(0, out);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("does not fit 32 bits"), absl::string_view::npos) << st;
}

TEST(Blend, EachSampleFromTheDatasetFurthestBelowItsWeight) {
  const auto counts = BlendedDataset::samples_needed({0.3, 0.7}, 1000);
  EXPECT_EQ(counts, (std::vector<std::int64_t>{300, 700}));
  std::vector<std::unique_ptr<SampleSource>> parts;
  for (int k = 0; k < 2; k++) {
    std::vector<std::vector<std::int32_t>> docs(1, std::vector<std::int32_t>(1000 * 4 + 1, k));
    auto ds = GptDataset::build(memory_documents("m", docs), {0, 1}, spec(4, 10, false),
                                counts[k] + 1, "train");
    ASSERT_TRUE(ds.ok());
    parts.push_back(std::move(*ds));
  }
  auto blend = BlendedDataset::build({0.3, 0.7}, std::move(parts), 1000);
  ASSERT_TRUE(blend.ok()) << blend.status();
  int seen[2] = {0, 0};
  for (int i = 0; i < 1000; i++) {
    const int k = (*blend)->dataset_of(i);
    EXPECT_EQ(sample_of(**blend, i, 4)[0], k);
    seen[k]++;
    EXPECT_LE(std::abs(seen[1] - 0.7 * (i + 1)), 1.0) << i;  // never more than one behind
  }
  EXPECT_EQ((*blend)->dataset_of(0), 1);  // the heavier dataset first
}

TEST(DataPath, WeightsAndPrefixes) {
  auto one = parse_data_path({"data/a"});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0].second, "data/a");
  auto two = parse_data_path({"1", "a", "3", "b"});
  ASSERT_TRUE(two.ok());
  EXPECT_DOUBLE_EQ((*two)[1].first, 0.75);
  EXPECT_TRUE(absl::IsInvalidArgument(parse_data_path({"a", "b"}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(parse_data_path({"0.5", "a", "0.5"}).status()));
}

// The global batch does not depend on the data-parallel size: replica d's
// micro-batch j is the global batch's micro-batch j*dp + d.
TEST(Batches, GlobalBatchIndependentOfDataParallelSize) {
  const int B = 2, gbs = 16;
  for (int dp : {1, 2, 4}) {
    const int m = gbs / (B * dp);
    std::set<std::int64_t> firsts;
    for (int d = 0; d < dp; d++)
      for (int j = 0; j < m; j++) firsts.insert(micro_batch_first_sample(3 * gbs, d, dp, j, B));
    std::set<std::int64_t> want;
    for (int k = 0; k < gbs / B; k++) want.insert(3 * gbs + k * B);
    EXPECT_EQ(firsts, want) << dp;
  }
  EXPECT_EQ(micro_batch_first_sample(0, 1, 2, 1, 4), (1 * 2 + 1) * 4);
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

// Untrusted-input parsers outside the dataset code, as fuzz/ checks them.
// safetensors: a dimension of 2^63 or more (read back negative) next to a 0
// (so the byte count agreed) was accepted; fuzz/safetensors_fuzz.cc asserts
// dimensions are non-negative (input in fuzz/corpus/safetensors).
TEST(Safetensors, DimensionBeyond63BitsIsAnError) {
  const std::string path = ::testing::TempDir() + "/troupe_huge_dim.safetensors";
  const std::string header =
      R"({"t":{"dtype":"F32","shape":[9223372036854775808,0],"data_offsets":[0,0]}})";
  std::string file;
  put<std::uint64_t>(file, header.size());
  file += header;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("tensor 't': dimension 9223372036854775808 does not fit"),
            absl::string_view::npos)
      << f.status();
}

}  // namespace
}  // namespace troupe::model::data
