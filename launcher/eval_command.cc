// `troupe eval`: zero-shot evaluation of a trained model, as Megatron's
// tasks/zeroshot_gpt (model/evaluation.h), on any tp x pp layout.
//
//   troupe eval --task perplexity --data-path data/pile_text_document --stride 512 ...
//   troupe eval --task lambada --data lambada_test.jsonl ...
//
// perplexity: the dataset's documents in order as one token stream; lambada:
// one {"text": ...} per line. --json prints one object.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/commands.h"
#include "launcher/model_flags.h"
#include "model/data/indexed_dataset.h"
#include "model/evaluation.h"

namespace troupe::launcher {
namespace {

struct EvalFlags {
  ModelFlags model;
  std::string task;
  std::string data_path;      // perplexity: an indexed dataset's prefix
  std::string data;           // lambada: jsonl
  std::optional<int> stride;  // default: Megatron's --overlapping-eval, 32 (T if shorter)
  std::int64_t max_tokens = 0;
  bool json = false;
};

// The dataset's documents in order as one stream, read a window at a time.
absl::StatusOr<model::PerplexityResult> dataset_perplexity(const EvalFlags& f,
                                                           model::LanguageModel& lm, int stride) {
  absl::StatusOr<std::unique_ptr<model::data::IndexedDataset>> ds =
      model::data::IndexedDataset::open(f.data_path);
  if (!ds.ok()) return ds.status();
  std::int64_t n = (*ds)->num_tokens();
  if (f.max_tokens > 0) n = std::min(n, f.max_tokens);
  absl::StatusOr<model::PerplexityResult> r = model::perplexity(
      lm, n,
      [&](std::int64_t begin, std::span<std::int32_t> out) { return (*ds)->read(begin, out); },
      stride);
  if (!r.ok() && !absl::StrContains(r.status().message(), "--stride")) {
    return absl::Status(r.status().code(),
                        absl::StrCat("--data-path ", f.data_path, ": ", r.status().message()));
  }
  return r;
}

absl::StatusOr<std::vector<model::LambadaExample>> read_lambada(const std::string& path,
                                                                model::data::BpeEncoder& encoder) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--data ", path, ": cannot open it"));
  std::vector<model::LambadaExample> out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); line_no++) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat("--data ", path, ":", line_no, ": ");
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError(where + "not a JSON object");
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
      return absl::InvalidArgumentError(where + "has no string \"text\"");
    }
    absl::StatusOr<model::LambadaExample> ex =
        model::lambada_example(encoder, j["text"].get<std::string>());
    if (!ex.ok()) return absl::InvalidArgumentError(where + std::string(ex.status().message()));
    out.push_back(std::move(*ex));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("--data ", path, ": read error"));
  if (out.empty())
    return absl::InvalidArgumentError(absl::StrCat("--data ", path, ": no examples"));
  return out;
}

int run(const EvalFlags& f) {
  if (f.task == "perplexity" && f.data_path.empty()) {
    return command_failed("eval",
                          absl::InvalidArgumentError("--task perplexity needs --data-path PREFIX"));
  }
  if (f.task == "lambada" && f.data.empty()) {
    return command_failed("eval",
                          absl::InvalidArgumentError("--task lambada needs --data FILE.jsonl"));
  }
  if (f.max_tokens < 0)
    return command_failed("eval", absl::InvalidArgumentError("--max-tokens must not be negative"));
  absl::StatusOr<LoadedModel> m = load_model(f.model);
  if (!m.ok()) return command_failed("eval", m.status());
  std::fprintf(stderr, "troupe eval: %s\n", m->description.c_str());
  if (f.task == "perplexity") {
    const int stride = f.stride.value_or(std::min(32, m->lm->context()));
    absl::StatusOr<model::PerplexityResult> r = dataset_perplexity(f, *m->lm, stride);
    if (!r.ok()) return command_failed("eval", r.status());
    if (f.json) {
      const nlohmann::json j = {{"task", "perplexity"},  {"perplexity", r->perplexity()},
                                {"loss", r->loss()},     {"tokens", r->tokens},
                                {"windows", r->windows}, {"stride", stride}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("perplexity %s over %lld tokens (loss %s nats; %lld windows of %d, stride %d)\n",
                  absl::StrFormat("%.4f", r->perplexity()).c_str(),
                  static_cast<long long>(r->tokens), absl::StrFormat("%.6f", r->loss()).c_str(),
                  static_cast<long long>(r->windows), m->lm->context(), stride);
    }
    return 0;
  }
  model::data::BpeEncoder encoder(*m->vocab);
  absl::StatusOr<std::vector<model::LambadaExample>> examples = read_lambada(f.data, encoder);
  if (!examples.ok()) return command_failed("eval", examples.status());
  absl::StatusOr<model::LambadaResult> r = model::lambada(*m->lm, *examples);
  if (!r.ok()) return command_failed("eval", r.status());
  if (f.json) {
    const nlohmann::json j = {{"task", "lambada"},
                              {"accuracy", r->accuracy()},
                              {"correct", r->correct},
                              {"total", r->total},
                              {"mean_logprob", r->mean_logprob()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("lambada: accuracy %s (%lld of %lld), mean target log-likelihood %s nats\n",
                absl::StrFormat("%.2f%%", 100 * r->accuracy()).c_str(),
                static_cast<long long>(r->correct), static_cast<long long>(r->total),
                absl::StrFormat("%.4f", r->mean_logprob()).c_str());
  }
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Zero-shot evaluation: perplexity over a dataset, or strict LAMBADA accuracy");
  add_model_flags(cmd, f->model);
  cmd->add_option("--task", f->task, "perplexity or lambada")
      ->required()
      ->check(CLI::IsMember({"perplexity", "lambada"}));
  cmd->add_option("--data-path", f->data_path, "perplexity: an indexed dataset (PREFIX.bin/.idx)");
  cmd->add_option("--data", f->data, "lambada: one {\"text\": ...} per line");
  cmd->add_option("--stride,--overlapping-eval", f->stride,
                  "perplexity: windows of T tokens move by S; each scores its last S (default "
                  "32, Megatron's)");
  cmd->add_option("--max-tokens", f->max_tokens, "perplexity: only the dataset's first N tokens");
  cmd->add_flag("--json", f->json, "One JSON object with the figures");
  return [f] { return run(*f); };
}

}  // namespace troupe::launcher
