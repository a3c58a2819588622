// Tokenizes jsonl documents into Megatron indexed datasets, as Megatron-LM's
// tools/preprocess_data.py does (one sequence per document), multi-threaded.
//
// Input: one JSON object per line, plain or .zst (The Pile's format, with
// "text" and "meta": {"pile_set_name": ...}). For each --json-keys key the
// output is PREFIX_<key>_document.{bin,idx}; with split_by_meta, one dataset
// per meta value: PREFIX_<value>_<key>_document. A line that is not a JSON
// object, lacks a key, or is not valid UTF-8 is counted, reported with its
// line number and skipped; the run fails only past max_bad_lines.
//
//   PreprocessOptions o{.input = "00.jsonl.zst", .output_prefix = "pile",
//                       .vocab_file = "encoder.json", .merge_file = "vocab.bpe"};
//   absl::StatusOr<PreprocessReport> r = preprocess(o, on_progress);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::model::data {

struct PreprocessOptions {
  std::string input;
  std::vector<std::string> json_keys = {"text"};
  std::string output_prefix;
  std::string vocab_file, merge_file;
  bool append_eod = false;
  int workers = 1;
  std::string split_by_meta;  // a key of the "meta" object, e.g. pile_set_name
  std::int64_t max_bad_lines = 1000;
};

struct BadLine {
  std::int64_t line = 0;  // 1-based
  std::string reason;
};

struct PreprocessProgress {
  std::int64_t documents = 0, lines = 0, bad_lines = 0;
  std::uint64_t input_bytes = 0, input_size = 0;  // as read from disk
  double elapsed_s = 0;
};

struct PreprocessReport {
  PreprocessProgress totals;
  std::int64_t tokens = 0;
  std::int64_t empty_documents = 0;  // no tokens: documents without sequences, as Megatron
  std::vector<BadLine> bad;          // every skipped line
  std::map<std::string, std::int64_t> documents_by_output;  // prefix -> documents
};

// `on_progress` is called from the calling thread about twice a second and
// at the end; `on_bad_line` as each bad line is met.
absl::StatusOr<PreprocessReport> preprocess(
    const PreprocessOptions& options,
    const std::function<void(const PreprocessProgress&)>& on_progress = nullptr,
    const std::function<void(const BadLine&)>& on_bad_line = nullptr);

}  // namespace troupe::model::data
