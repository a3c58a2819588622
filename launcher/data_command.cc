// `troupe data`: dataset utilities. `info` describes and validates a Megatron
// indexed dataset; `synth` writes the synthetic phrase corpus as one.
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

const char* dtype_name(model::data::TokenDType d) {
  switch (d) {
    case model::data::TokenDType::kU8:
      return "u8";
    case model::data::TokenDType::kI8:
      return "i8";
    case model::data::TokenDType::kI16:
      return "i16";
    case model::data::TokenDType::kI32:
      return "i32";
    case model::data::TokenDType::kI64:
      return "i64";
    case model::data::TokenDType::kF64:
      return "f64";
    case model::data::TokenDType::kF32:
      return "f32";
    case model::data::TokenDType::kU16:
      return "u16";
  }
  return "?";
}

int run_info(const std::string& prefix) {
  auto ds = model::data::IndexedDataset::open(prefix);
  if (!ds.ok()) {
    std::fprintf(stderr, "troupe data info: error: %s\n",
                 std::string(ds.status().message()).c_str());
    return 1;
  }
  std::printf(
      "%s\n  documents: %lld\n  sequences: %lld\n  tokens:    %lld\n  dtype:     %s\n"
      "  valid: header, index size, document index, and every pointer within the .bin\n",
      prefix.c_str(), static_cast<long long>((*ds)->num_documents()),
      static_cast<long long>((*ds)->num_sequences()), static_cast<long long>((*ds)->num_tokens()),
      dtype_name((*ds)->dtype()));
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
  auto info_prefix = std::make_shared<std::string>();
  CLI::App* info = data->add_subcommand("info", "Describe and validate a Megatron indexed dataset");
  info->add_option("prefix", *info_prefix, "PREFIX of PREFIX.bin and PREFIX.idx")->required();
  return [flags, info, synth, info_prefix]() {
    if (info->parsed()) return run_info(*info_prefix);
    return run_synth(*flags);
  };
}

}  // namespace troupe::launcher
