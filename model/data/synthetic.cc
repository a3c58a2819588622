// The repeated-phrase corpus.
#include "model/data/synthetic.h"

#include "model/init.h"

namespace troupe::model::data {
namespace {

// Uniform integer in [0, n) from counter `i` of stream `stream`.
std::uint32_t draw(std::uint64_t seed, std::uint32_t stream, std::uint64_t i, std::uint32_t n) {
  auto r =
      philox4x32({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32), stream, 0},
                 {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(r[0]) * n) >> 32);
}

}  // namespace

std::vector<std::vector<std::int32_t>> phrase_corpus(const PhraseCorpusOptions& o) {
  std::vector<std::vector<std::int32_t>> phrases(static_cast<std::size_t>(o.num_phrases));
  std::uint64_t counter = 0;
  const std::uint32_t span = static_cast<std::uint32_t>(o.max_phrase - o.min_phrase + 1);
  for (auto& p : phrases) {
    const int len = o.min_phrase + static_cast<int>(draw(o.seed, 1, counter++, span));
    for (int i = 0; i < len; i++) {
      p.push_back(1 + static_cast<std::int32_t>(draw(
                          o.seed, 2, counter++, static_cast<std::uint32_t>(o.vocab_size - 1))));
    }
  }
  std::vector<std::vector<std::int32_t>> docs;
  std::int64_t total = 0;
  std::uint64_t pick = 0;
  while (total < o.num_tokens) {
    std::vector<std::int32_t> doc;
    for (int k = 0; k < o.phrases_per_document; k++) {
      const auto& p = phrases[draw(o.seed, 3, pick++, static_cast<std::uint32_t>(o.num_phrases))];
      doc.insert(doc.end(), p.begin(), p.end());
    }
    doc.push_back(0);
    total += static_cast<std::int64_t>(doc.size());
    docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace troupe::model::data
