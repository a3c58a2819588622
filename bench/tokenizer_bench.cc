// GPT-2 BPE encode throughput on one thread, as JSON lines:
//   {"impl": "troupe", "cache": "cold"|"warm", "MB_per_s": ..., "tokens": ...}
// cold: a new encoder (empty merge cache) for every pass; warm: one encoder.
// scripts/bench tokenizer runs it beside js-tiktoken (bench/tokenizer_js.cjs).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/data/bpe.h"

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 BPE encode throughput"};
  std::string text_path, vocab, merges;
  int passes = 5;
  app.add_option("--text", text_path)->required();
  app.add_option("--vocab-file", vocab)->required();
  app.add_option("--merge-file", merges)->required();
  app.add_option("--passes", passes)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::ifstream in(text_path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  auto v = troupe::model::data::Gpt2Vocab::load(vocab, merges);
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", std::string(v.status().message()).c_str());
    return 1;
  }
  using Clock = std::chrono::steady_clock;
  troupe::model::data::BpeEncoder warm(**v);
  for (const char* mode : {"cold", "warm"}) {
    double best = 1e30;
    std::size_t n = 0;
    for (int p = 0; p < passes; p++) {
      troupe::model::data::BpeEncoder cold(**v);
      troupe::model::data::BpeEncoder& enc = mode[0] == 'c' ? cold : warm;
      std::vector<std::int32_t> ids;
      ids.reserve(text.size() / 2);
      const auto t0 = Clock::now();
      if (!enc.encode(text, &ids).ok()) return 1;
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
      n = ids.size();
    }
    std::printf(
        "{\"impl\": \"troupe\", \"cache\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, "
        "\"seconds\": %.4f, \"MB_per_s\": %.2f}\n",
        mode, text.size(), n, best, static_cast<double>(text.size()) / best / 1e6);
  }
  return 0;
}
