// Fuzzes the Megatron .idx/.bin reader (IndexedDataset::open, read) and the
// sample construction (GptDataset) over whatever it accepts.
//
// Input: u16 n, n bytes of .idx, then the .bin (fuzz_util.h split_two).
// Checks: a rejected pair has a message naming the file; an accepted one
// reads all its tokens (or names an id that does not fit 32 bits), and its
// file-order samples are windows of T+1 tokens of the repeated stream at
// i*T (brute force over the tokens read here).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/data/gpt_dataset.h"
#include "model/data/indexed_dataset.h"

using namespace troupe::model::data;
using troupe::fuzz::scratch_path;
using troupe::fuzz::write_file;

namespace {

void check_samples(const std::shared_ptr<DocumentSource>& src, const std::vector<std::int32_t>& all,
                   bool all_ok, bool shuffle) {
  constexpr int T = 3;
  constexpr std::int64_t kSamples = 8;
  const SampleSpec spec{.T = T, .V = 1 << 30, .seed = 5, .shuffle = shuffle, .cache_dir = ""};
  auto ds = GptDataset::build(src, {0, src->num_documents()}, spec, kSamples, "train");
  if (!ds.ok()) {
    FUZZ_CHECK(absl::IsFailedPrecondition(ds.status()));
    return;
  }
  std::vector<std::int32_t> out(T + 1);
  for (std::int64_t i = 0; i < kSamples; i++) {
    absl::Status st = (*ds)->sample(i, out);
    if (!st.ok()) {  // an id outside [0, V) or one that does not fit 32 bits
      FUZZ_CHECK(absl::IsInvalidArgument(st));
      continue;
    }
    if (shuffle || !all_ok) continue;
    for (int k = 0; k <= T; k++) {
      FUZZ_CHECK(out[static_cast<std::size_t>(k)] ==
                 all[static_cast<std::size_t>(i * T + k) % all.size()]);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string prefix = [] {
    const std::string dir = scratch_path("ds");
    std::filesystem::create_directories(dir);
    return dir + "/ds";
  }();
  auto [idx, bin] = troupe::fuzz::split_two(data, size);
  write_file(prefix + ".idx", idx);
  write_file(prefix + ".bin", bin);
  auto ds = IndexedDataset::open(prefix);
  if (!ds.ok()) {
    FUZZ_CHECK(ds.status().message().find(prefix) != absl::string_view::npos);
    return 0;
  }
  const IndexedDataset& d = **ds;
  FUZZ_CHECK(d.num_tokens() >= 0 && static_cast<std::size_t>(d.num_tokens()) <= bin.size());
  FUZZ_CHECK(d.document_index(0) == 0 && d.document_index(d.num_documents()) == d.num_sequences());
  std::vector<std::int32_t> all(static_cast<std::size_t>(d.num_tokens()));
  absl::Status st = d.read(0, all);
  FUZZ_CHECK(st.ok() || absl::IsInvalidArgument(st));
  // Reading in two parts gives the same tokens.
  if (st.ok() && all.size() > 1) {
    const std::size_t half = all.size() / 2;
    std::vector<std::int32_t> tail(all.size() - half);
    FUZZ_CHECK(d.read(static_cast<std::int64_t>(half), tail).ok());
    FUZZ_CHECK(std::equal(tail.begin(), tail.end(), all.begin() + static_cast<long>(half)));
  }
  std::vector<std::int32_t> one(1);
  FUZZ_CHECK(absl::IsOutOfRange(d.read(d.num_tokens(), one)));
  auto src = open_indexed_documents(prefix);
  FUZZ_CHECK(src.ok());
  check_samples(*src, all, st.ok(), /*shuffle=*/false);
  check_samples(*src, all, st.ok(), /*shuffle=*/true);
  return 0;
}
