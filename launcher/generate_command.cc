// `troupe generate`: text from a trained model, with a KV cache, on any
// tp x pp layout (launcher/model_flags.h names the model).
//
//   troupe generate --weights w.safetensors --vocab-file encoder.json --merge-file vocab.bpe
//       --prompt "The actor model" --max-new-tokens 40 [--temperature 0.8 --top-k 40 --seed 1]
//
// Each prompt is encoded with GPT-2's BPE and continued until <|endoftext|>
// or --max-new-tokens; prompt k's sampler starts from --seed + k (as
// `troupe serve`'s k-th prompt of a request), so a prompt's text does not
// depend on the others' and two equal prompts get two samples. Plain output streams the
// prompt and its continuation; --json prints one object per prompt.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "launcher/commands.h"
#include "launcher/model_flags.h"
#include "model/generation.h"

namespace troupe::launcher {
namespace {

struct GenerateFlags {
  ModelFlags model;
  std::vector<std::string> prompts;
  std::string prompt_file;
  int max_new_tokens = 64;
  model::SamplingOptions sampling;
  bool json = false;
  bool no_cache = false;
};

// --prompt-file: one prompt per line (empty lines skipped); `where` says
// where each came from.
absl::Status read_prompts(const std::string& path, std::vector<std::string>* out,
                          std::vector<std::string>* where) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompt-file ", path, ": cannot open it"));
  std::string line;
  for (int line_no = 1; std::getline(in, line); line_no++) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    out->push_back(line);
    where->push_back(absl::StrCat("--prompt-file ", path, ":", line_no));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("--prompt-file ", path, ": read error"));
  if (out->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--prompt-file ", path, ": no prompts in it"));
  }
  return absl::OkStatus();
}

// Writes the new bytes of a growing decoded text (a token's bytes may end
// inside a UTF-8 character; the terminal joins them).
class Streamer {
 public:
  explicit Streamer(const model::data::Gpt2Vocab& v) : vocab_(v) {}
  void add(std::int32_t id) {
    if (id == vocab_.eod()) return;
    const std::string& b = vocab_.token_bytes(id);
    std::fwrite(b.data(), 1, b.size(), stdout);
    std::fflush(stdout);
  }

 private:
  const model::data::Gpt2Vocab& vocab_;
};

int run(GenerateFlags& f) {
  std::vector<std::string> where;
  for (std::size_t k = 0; k < f.prompts.size(); k++)
    where.push_back(absl::StrCat("--prompt ", k + 1));
  if (!f.prompt_file.empty()) {
    if (absl::Status st = read_prompts(f.prompt_file, &f.prompts, &where); !st.ok())
      return command_failed("generate", st);
  }
  if (f.prompts.empty())
    return command_failed("generate", absl::InvalidArgumentError("give --prompt or --prompt-file"));
  if (f.max_new_tokens < 0) {
    return command_failed("generate",
                          absl::InvalidArgumentError("--max-new-tokens must not be negative"));
  }
  if (absl::Status st = f.sampling.validate(); !st.ok()) return command_failed("generate", st);
  absl::StatusOr<LoadedModel> m = load_model(f.model);
  if (!m.ok()) return command_failed("generate", m.status());
  std::fprintf(stderr, "troupe generate: %s\n", m->description.c_str());
  model::data::BpeEncoder encoder(*m->vocab);
  for (std::size_t k = 0; k < f.prompts.size(); k++) {
    const std::string& prompt = f.prompts[k];
    std::vector<std::int32_t> ids;
    if (absl::Status st = encoder.encode(prompt, &ids); !st.ok()) {
      return command_failed("generate",
                            absl::InvalidArgumentError(absl::StrCat(where[k], ": ", st.message())));
    }
    if (ids.empty()) {
      return command_failed("generate", absl::InvalidArgumentError(
                                            absl::StrCat(where[k], ": the prompt has no tokens")));
    }
    model::GenerateOptions o;
    o.max_new_tokens = f.max_new_tokens;
    o.sampling = f.sampling;
    o.sampling.seed += k;
    o.eod = m->vocab->eod();
    o.use_cache = !f.no_cache;
    if (ids.size() + static_cast<std::size_t>(f.max_new_tokens) >
        static_cast<std::size_t>(m->lm->context())) {
      return command_failed(
          "generate", absl::InvalidArgumentError(absl::StrCat(
                          "--max-new-tokens ", f.max_new_tokens, ": with the prompt's ", ids.size(),
                          " tokens it needs more than the model's context of ", m->lm->context())));
    }
    Streamer out(*m->vocab);
    if (!f.json) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<model::Generated> g =
        model::generate(*m->lm, ids, o, [&](std::span<const float>, std::int32_t id) {
          if (!f.json) out.add(id);
        });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!g.ok()) {
      return command_failed(
          "generate",
          absl::Status(g.status().code(), absl::StrCat("--max-new-tokens ", f.max_new_tokens, ": ",
                                                       g.status().message())));
    }
    std::vector<std::int32_t> text_ids = g->tokens;
    if (g->stopped_at_eod) text_ids.pop_back();
    absl::StatusOr<std::string> text = m->vocab->decode(text_ids);
    if (!text.ok()) return command_failed("generate", text.status());
    if (f.json) {
      nlohmann::json j = {{"prompt", prompt},
                          {"prompt_tokens", ids},
                          {"tokens", g->tokens},
                          {"text", *text},
                          {"stop", g->stopped_at_eod ? "eod" : "length"},
                          {"seconds", seconds},
                          {"tokens_per_s", static_cast<double>(g->tokens.size()) / seconds}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate text from a trained model (a KV cache; any --tp x --pp layout)");
  add_model_flags(cmd, f->model);
  cmd->add_option("--prompt", f->prompts, "A prompt (may be given several times)");
  cmd->add_option("--prompt-file", f->prompt_file, "Prompts, one per line");
  cmd->add_option("--max-new-tokens,--out-seq-length", f->max_new_tokens,
                  "Tokens to generate per prompt (fewer if <|endoftext|> comes)")
      ->capture_default_str();
  cmd->add_option("--temperature", f->sampling.temperature,
                  "Divide the logits by this before sampling (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", f->sampling.top_k, "Sample from the k most likely (0: all; 1: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-p", f->sampling.top_p,
                  "Sample from the most likely ids whose probability reaches p (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", f->sampling.seed, "Seed of the first prompt's sampler (prompt k: + k)")
      ->capture_default_str();
  cmd->add_flag(
      "--greedy", [f](std::int64_t) { f->sampling.top_k = 1; },
      "Greedy decoding (the argmax; as --top-k 1)");
  cmd->add_flag("--json", f->json,
                "One JSON object per prompt: prompt, prompt_tokens, tokens (the new ids), text, "
                "stop (eod or length), seconds and tokens_per_s (the prompt's forward and every "
                "step)");
  cmd->add_flag("--no-kv-cache", f->no_cache,
                "Feed the whole sequence at every step (slow; for comparison)");
  return [f] { return run(*f); };
}

}  // namespace troupe::launcher
