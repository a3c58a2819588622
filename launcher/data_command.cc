// `troupe data`: dataset utilities. `synth` writes the synthetic phrase corpus
// as a Megatron indexed dataset (the quickstart's data until real text comes).
#include <cstdio>
#include <memory>
#include <string>

#include "launcher/commands.h"
#include "model/data/indexed_dataset.h"
#include "model/data/synthetic.h"

namespace troupe::launcher {
namespace {

struct SynthFlags {
  std::string output_prefix;
  model::data::PhraseCorpusOptions corpus;
};

int run_synth(const SynthFlags& f) {
  if (f.corpus.vocab_size < 2) {
    std::fprintf(stderr, "troupe data synth: error: --vocab-size must be at least 2\n");
    return 1;
  }
  auto docs = model::data::phrase_corpus(f.corpus);
  std::int64_t tokens = 0;
  for (const auto& d : docs) tokens += static_cast<std::int64_t>(d.size());
  absl::Status st = model::data::write_indexed_dataset(
      f.output_prefix, docs, model::data::token_dtype_for_vocab(f.corpus.vocab_size));
  if (!st.ok()) {
    std::fprintf(stderr, "troupe data synth: error: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("wrote %s.bin/.idx: %zu documents, %lld tokens, vocabulary %d\n",
              f.output_prefix.c_str(), docs.size(), static_cast<long long>(tokens),
              f.corpus.vocab_size);
  return 0;
}

}  // namespace

Command add_data_command(CLI::App& app) {
  auto flags = std::make_shared<SynthFlags>();
  CLI::App* data = app.add_subcommand("data", "Dataset utilities");
  data->require_subcommand(1);
  CLI::App* synth = data->add_subcommand(
      "synth", "Write a learnable synthetic corpus (repeated phrases) as a Megatron dataset");
  synth->add_option("--output-prefix", flags->output_prefix, "Writes PREFIX.bin and PREFIX.idx")
      ->required();
  synth->add_option("--vocab-size", flags->corpus.vocab_size, "Token ids in [0, V)")
      ->capture_default_str();
  synth->add_option("--num-tokens", flags->corpus.num_tokens, "At least this many tokens")
      ->capture_default_str();
  synth->add_option("--seed", flags->corpus.seed, "Seed of the phrases and their order")
      ->capture_default_str();
  return [flags] { return run_synth(*flags); };
}

}  // namespace troupe::launcher
