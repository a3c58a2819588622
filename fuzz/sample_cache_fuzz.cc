// Fuzzes the sample-index cache reader (GptDataset::build with a cache
// directory, which loads DIR/<dataset>_<label>_<key>.samples when present).
//
// The cache file is fuzzed for a fixed source of 12 documents (some empty)
// and T = 4. Checks: whatever the file holds, build succeeds (a stale or
// corrupt cache is rebuilt, never trusted) and every sample reads.
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/data/gpt_dataset.h"

using namespace troupe::model::data;

namespace {

constexpr int kT = 4;
constexpr std::int64_t kSamples = 20;
std::shared_ptr<DocumentSource> g_source;
std::unique_ptr<GptDataset> g_fresh;  // built without a cache
SampleSpec g_spec;
std::string g_cache_file;

std::unique_ptr<GptDataset> build(const SampleSpec& spec) {
  auto ds = GptDataset::build(g_source, {0, g_source->num_documents()}, spec, kSamples, "train");
  FUZZ_CHECK(ds.ok());
  return std::move(*ds);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::vector<std::vector<std::int32_t>> docs;
  const int sizes[] = {5, 0, 3, 9, 0, 0, 1, 4, 7, 0, 2, 6};
  std::int32_t next = 0;
  for (int n : sizes) {
    docs.emplace_back();
    for (int k = 0; k < n; k++) docs.back().push_back(next++ % 50);
  }
  g_source = memory_documents("fuzz_docs", std::move(docs));
  const std::string dir = troupe::fuzz::scratch_path("cache");
  std::filesystem::create_directories(dir);
  g_spec = {.T = kT, .V = 50, .seed = 3, .shuffle = true, .cache_dir = dir};
  SampleSpec no_cache = g_spec;
  no_cache.cache_dir.clear();
  g_fresh = build(no_cache);
  g_cache_file = build(g_spec)->cache_file();  // where build() looks
  // fuzz/make_corpus.py: the valid cache file is the seed.
  if (const char* seed = std::getenv("TROUPE_FUZZ_SEED_OUT")) {
    std::filesystem::copy_file(g_cache_file, seed,
                               std::filesystem::copy_options::overwrite_existing);
  }
  return 0;
}

// Input: a mode byte, then the file. Mode bit 0 set: the target writes the
// body's checksum into the header (model/data/gpt_dataset.cc's layout), so
// the consistency checks behind it are fuzzed too; then the samples need only
// read without error (the indices may differ from a fresh build's and still
// be consistent), else they must equal the fresh build's.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool fix_checksum = (data[0] & 1) != 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (fix_checksum && file.size() >= 32) {
    const std::uint64_t h = ::crc32(::crc32(0L, Z_NULL, 0),  // zlib's CRC-32 of the body
                                    reinterpret_cast<const Bytef*>(file.data() + 32),
                                    static_cast<uInt>(file.size() - 32));
    std::memcpy(file.data() + 24, &h, 8);
  }
  troupe::fuzz::write_file(g_cache_file, file);
  std::unique_ptr<GptDataset> ds = build(g_spec);
  std::vector<std::int32_t> got(kT + 1), want(kT + 1);
  for (std::int64_t i = 0; i < kSamples; i++) {
    FUZZ_CHECK(ds->sample(i, got).ok());
    FUZZ_CHECK(g_fresh->sample(i, want).ok());
    FUZZ_CHECK(fix_checksum || got == want);
  }
  return 0;
}
