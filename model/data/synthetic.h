// A learnable synthetic corpus: documents made of phrases drawn from a small
// fixed set, so a model can learn each phrase's continuation (its loss falls
// well below log V) while the first token of each phrase stays uncertain.
// Used by `troupe train` when no --data-path is given and by the quickstart.
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::model::data {

struct PhraseCorpusOptions {
  int vocab_size = 512;  // ids in [1, vocab_size); 0 ends a document
  std::int64_t num_tokens = 1 << 20;
  int num_phrases = 64;
  int min_phrase = 4, max_phrase = 16;
  int phrases_per_document = 24;
  std::uint64_t seed = 1;
};

// Documents, each ending with the end-of-document id 0.
std::vector<std::vector<std::int32_t>> phrase_corpus(const PhraseCorpusOptions& options);

}  // namespace troupe::model::data
