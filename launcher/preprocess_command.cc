// `troupe preprocess`: jsonl[.zst] -> Megatron indexed datasets (GPT-2 BPE),
// with Megatron's flags, a progress line and every bad line reported.
#include <cstdio>
#include <memory>
#include <string>

#include "launcher/commands.h"
#include "model/data/preprocess.h"

namespace troupe::launcher {
namespace {

std::string with_commas(std::int64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); i++) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

void print_progress(const model::data::PreprocessProgress& p) {
  const double mb = static_cast<double>(p.input_bytes) / 1e6;
  const double pct =
      p.input_size ? 100.0 * static_cast<double>(p.input_bytes) / static_cast<double>(p.input_size)
                   : 100.0;
  std::fprintf(
      stderr, "\r%5.1f%% | %s documents | %.0f docs/s | %.1f MB/s | %s bad lines | %.1fs%s", pct,
      with_commas(p.documents).c_str(),
      p.elapsed_s > 0 ? static_cast<double>(p.documents) / p.elapsed_s : 0.0,
      p.elapsed_s > 0 ? mb / p.elapsed_s : 0.0, with_commas(p.bad_lines).c_str(), p.elapsed_s, "");
  std::fflush(stderr);
}

int run(const model::data::PreprocessOptions& o) {
  int shown = 0;
  auto report = model::data::preprocess(
      o, [](const model::data::PreprocessProgress& p) { print_progress(p); },
      [&](const model::data::BadLine& b) {
        if (shown++ < 20) {
          std::fprintf(stderr, "\r\033[K%s:%lld: skipped: %s\n", o.input.c_str(),
                       static_cast<long long>(b.line), b.reason.c_str());
        } else if (shown == 21) {
          std::fprintf(stderr, "\r\033[K(further bad lines are counted, not shown)\n");
        }
      });
  if (!report.ok()) {
    std::fprintf(stderr, "\ntroupe preprocess: error: %s\n",
                 std::string(report.status().message()).c_str());
    return 1;
  }
  std::fputc('\n', stderr);  // after the last progress line
  std::printf(
      "%s documents (%s empty: no sequences, as Megatron), %s tokens, %s bad lines skipped\n",
      with_commas(report->totals.documents).c_str(), with_commas(report->empty_documents).c_str(),
      with_commas(report->tokens).c_str(), with_commas(report->totals.bad_lines).c_str());
  for (const auto& [prefix, docs] : report->documents_by_output) {
    std::printf("  %s.bin/.idx: %s documents\n", prefix.c_str(), with_commas(docs).c_str());
  }
  return 0;
}

}  // namespace

Command add_preprocess_command(CLI::App& app) {
  auto o = std::make_shared<model::data::PreprocessOptions>();
  CLI::App* cmd = app.add_subcommand(
      "preprocess", "Tokenize jsonl[.zst] documents into Megatron indexed datasets (GPT-2 BPE)");
  cmd->add_option("--input", o->input, "JSON lines, plain or .zst")->required();
  cmd->add_option("--json-keys", o->json_keys, "Keys to tokenize; one dataset each")
      ->capture_default_str();
  cmd->add_option("--output-prefix", o->output_prefix, "Writes PREFIX_<key>_document.bin/.idx")
      ->required();
  cmd->add_option("--vocab-file", o->vocab_file, "encoder.json or vocab.json")->required();
  cmd->add_option("--merge-file", o->merge_file, "vocab.bpe or merges.txt")->required();
  cmd->add_flag("--append-eod", o->append_eod, "End every document with <|endoftext|>");
  cmd->add_option("--workers", o->workers, "Tokenizing threads")->capture_default_str();
  cmd->add_option("--split-by-meta", o->split_by_meta,
                  "One dataset per value of meta.KEY (e.g. pile_set_name)");
  cmd->add_option("--max-bad-lines", o->max_bad_lines,
                  "Fail when more lines than this are malformed")
      ->capture_default_str();
  return [o] { return run(*o); };
}

}  // namespace troupe::launcher
