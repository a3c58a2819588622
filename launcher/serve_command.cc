// `troupe serve`: an HTTP text-generation server compatible with
// Megatron-LM's (tools/run_text_generation_server.py): PUT /api with
//   {"prompts": [...], "tokens_to_generate": 64, "temperature": 1.0, "top_k": 0,
//    "top_p": 0.0, "random_seed": 1, "logprobs": false, "add_BOS": false}
// answers {"text": [prompt + continuation, ...], "segments": [[token, ...], ...],
// "logprobs": [[...], ...] or null}, with Megatron's argument rules. On
// cpp-httplib (Debian's libcpp-httplib). GET /health says it is up.
//
// Limits: the request body (--max-request-bytes, else 413; a chunked body,
// 411), requests in progress at once (--max-concurrent, else 503), prompts
// per request (128, Megatron's) and tokens per request
// (--max-request-tokens: each prompt's tokens and tokens_to_generate).
// Every prompt is encoded and checked before any is generated. Every
// refusal is a 4xx/5xx with {"error": "..."}; the model runs one request at
// a time (one KV cache). Prompt k samples from seed + k (the request's
// random_seed, else one drawn from --seed's generator), as `troupe
// generate`'s k-th prompt; `text` is every id detokenized (a BOS and a
// final <|endoftext|> included), as Megatron's.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "launcher/commands.h"
#include "launcher/model_flags.h"
#include "model/generation.h"

namespace troupe::launcher {
namespace {

using nlohmann::json;

struct ServeFlags {
  ModelFlags model;
  std::string host = "127.0.0.1";
  int port = 5000;  // Megatron's
  std::size_t max_request_bytes = 1 << 20;
  int max_concurrent = 4;
  int max_request_tokens = 4096;
  std::uint64_t seed = 1234;
};

constexpr int kMaxPrompts = 128;  // Megatron's limit

// A parsed, checked request.
struct Request {
  std::vector<std::string> prompts;
  int tokens_to_generate = 64;
  bool logprobs = false;
  bool add_bos = false;
  bool log = true;
  model::SamplingOptions sampling;
  bool seeded = false;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void reply_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(dump(json{{"error", message}}), "application/json");
}

// Megatron's checks, in its order and (where it has one) with its message.
absl::StatusOr<Request> parse_request(const std::string& body) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("the request body is not JSON");
  if (!j.is_object()) return bad("the request body is not a JSON object");
  if (!j.contains("prompts")) return bad("prompts argument required");
  if (j.contains("max_len"))
    return bad("max_len is no longer used.  Replace with tokens_to_generate");
  if (j.contains("sentences")) return bad("sentences is no longer used.  Replace with prompts");
  Request r;
  const json& prompts = j["prompts"];
  if (!prompts.is_array()) return bad("prompts is not a list of strings");
  if (prompts.empty()) return bad("prompts is empty");
  if (prompts.size() > kMaxPrompts)
    return bad(absl::StrCat("Maximum number of prompts is ", kMaxPrompts));
  for (const json& p : prompts) {
    if (!p.is_string()) return bad("prompts is not a list of strings");
    r.prompts.push_back(p.get<std::string>());
  }
  if (j.contains("tokens_to_generate")) {
    const json& t = j["tokens_to_generate"];
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > (1 << 30)) {
      return bad("tokens_to_generate must be an integer greater than or equal to 0");
    }
    r.tokens_to_generate = t.get<int>();
  }
  if (j.contains("logprobs")) {
    if (!j["logprobs"].is_boolean()) return bad("logprobs must be a boolean value");
    r.logprobs = j["logprobs"].get<bool>();
  }
  if (r.tokens_to_generate == 0 && !r.logprobs) {
    return bad("tokens_to_generate=0 implies logprobs should be True");
  }
  if (j.contains("temperature")) {
    const json& t = j["temperature"];
    if (!t.is_number() || !(t.get<double>() > 0.0 && t.get<double>() <= 100.0)) {
      return bad("temperature must be a positive number less than or equal to 100.0");
    }
    r.sampling.temperature = t.get<double>();
  }
  if (j.contains("top_k")) {
    const json& k = j["top_k"];
    if (!k.is_number_integer() || k.get<std::int64_t>() < 0 || k.get<std::int64_t>() > 1000) {
      return bad(
          "top_k must be an integer equal to or greater than 0 and less than or equal to 1000");
    }
    r.sampling.top_k = k.get<int>();
  }
  if (j.contains("top_p")) {
    const json& p = j["top_p"];
    if (!p.is_number()) return bad("top_p must be a positive float less than or equal to 1.0");
    r.sampling.top_p = p.get<double>();
    if (r.sampling.top_p > 0.0 && r.sampling.top_k > 0) {
      return bad("cannot set both top-k and top-p samplings.");
    }
    if (!(r.sampling.top_p >= 0.0 && r.sampling.top_p <= 1.0)) {
      return bad("top_p must be less than or equal to 1.0");
    }
  }
  if (j.contains("add_BOS")) {
    if (!j["add_BOS"].is_boolean()) return bad("add_BOS must be a boolean value");
    r.add_bos = j["add_BOS"].get<bool>();
  }
  for (const char* flag : {"stop_on_double_eol", "stop_on_eol", "prevent_newline_after_colon"}) {
    if (!j.contains(flag)) continue;
    if (!j[flag].is_boolean()) return bad(absl::StrCat(flag, " must be a boolean value"));
    if (j[flag].get<bool>()) return bad(absl::StrCat(flag, " is not supported by troupe serve"));
  }
  if (j.contains("beam_width") && !j["beam_width"].is_null()) {
    return bad("beam_width (beam search) is not supported by troupe serve");
  }
  if (j.contains("random_seed")) {
    const json& s = j["random_seed"];
    if (!s.is_number_integer()) return bad("random_seed must be integer");
    if (s.get<std::int64_t>() < 0) return bad("random_seed must be a positive integer");
    r.sampling.seed = s.get<std::uint64_t>();
    r.seeded = true;
  }
  if (j.contains("no_log")) {
    if (!j["no_log"].is_boolean()) return bad("no_log must be a boolean value");
    r.log = !j["no_log"].get<bool>();
  }
  return r;
}

// Every prompt's ids (BOS first with add_BOS), checked against the model's
// context and the server's token limit before anything is generated.
absl::StatusOr<std::vector<std::vector<std::int32_t>>> encode_prompts(
    const Request& r, const ServeFlags& f, const model::data::Gpt2Vocab& vocab, int context) {
  model::data::BpeEncoder encoder(vocab);
  std::vector<std::vector<std::int32_t>> out;
  std::int64_t tokens = 0;
  for (std::size_t k = 0; k < r.prompts.size(); k++) {
    std::vector<std::int32_t> ids;
    if (r.add_bos) ids.push_back(vocab.eod());
    if (absl::Status st = encoder.encode(r.prompts[k], &ids); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", k, ": ", st.message()));
    }
    if (ids.empty())
      return absl::InvalidArgumentError(absl::StrCat("prompt ", k, " has no tokens"));
    const std::int64_t need = static_cast<std::int64_t>(ids.size()) + r.tokens_to_generate;
    if (need > context) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt ", k, " has ", ids.size(), " tokens; with tokens_to_generate ",
          r.tokens_to_generate, " it needs ", need, " positions, and the model has ", context));
    }
    tokens += need;
    out.push_back(std::move(ids));
  }
  if (tokens > f.max_request_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompts' tokens and tokens_to_generate for each come to ", tokens,
        "; this server allows ", f.max_request_tokens, " per request (--max-request-tokens)"));
  }
  return out;
}

class Api {
 public:
  Api(const ServeFlags& f, LoadedModel m) : f_(f), m_(std::move(m)), seeds_(f.seed) {}

  void handle(const httplib::Request& req, httplib::Response& res) {
    // Requests in progress, this one included: beyond the limit, 503.
    struct Count {
      std::atomic<int>& n;
      ~Count() { n--; }
    } count{in_flight_};
    if (++in_flight_ > f_.max_concurrent) {
      res.set_header("Retry-After", "1");
      reply_error(
          res, 503,
          absl::StrCat("busy: ", f_.max_concurrent, " requests in progress (--max-concurrent)"));
      return;
    }
    if (req.body.size() > f_.max_request_bytes) {  // httplib checks Content-Length; this the rest
      return reply_error(res, 413, "the request body is larger than --max-request-bytes");
    }
    absl::StatusOr<Request> r = parse_request(req.body);
    if (!r.ok()) return reply_error(res, 400, std::string(r.status().message()));
    absl::StatusOr<std::vector<std::vector<std::int32_t>>> prompts =
        encode_prompts(*r, f_, *m_.vocab, m_.lm->context());
    if (!prompts.ok()) return reply_error(res, 400, std::string(prompts.status().message()));
    const auto start = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(model_mu_);  // one KV cache: one request at a time
    if (!r->seeded) r->sampling.seed = seeds_();
    json text = json::array(), segments = json::array(), logprobs = json::array();
    std::int64_t generated = 0;
    for (std::size_t k = 0; k < prompts->size(); k++) {
      const std::vector<std::int32_t>& ids = (*prompts)[k];
      model::GenerateOptions o;
      o.max_new_tokens = r->tokens_to_generate;
      o.sampling = r->sampling;
      o.sampling.seed += k;  // prompt k's sampler: as `troupe generate`'s k-th prompt
      o.eod = m_.vocab->eod();
      o.logprobs = r->logprobs;
      absl::StatusOr<model::Generated> g = model::generate(*m_.lm, ids, o);
      if (!g.ok()) return reply_error(res, 500, std::string(g.status().message()));
      generated += static_cast<std::int64_t>(g->tokens.size());
      std::vector<std::int32_t> all = ids;
      all.insert(all.end(), g->tokens.begin(), g->tokens.end());
      // As Megatron's: every id detokenized, a BOS and a final
      // <|endoftext|> included.
      absl::StatusOr<std::string> t = m_.vocab->decode(all);
      if (!t.ok()) return reply_error(res, 500, std::string(t.status().message()));
      text.push_back(*t);
      json seg = json::array();
      for (std::int32_t id : all) seg.push_back(m_.vocab->token_bytes(id));
      segments.push_back(seg);
      std::vector<double> lp = g->prompt_logprobs;
      lp.insert(lp.end(), g->logprobs.begin(), g->logprobs.end());
      logprobs.push_back(lp);
    }
    res.set_content(dump(json{{"text", text},
                              {"segments", segments},
                              {"logprobs", r->logprobs ? logprobs : json(nullptr)}}),
                    "application/json");
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r->log) {
      std::fprintf(stderr, "troupe serve: %s PUT /api: %zu prompts, %lld tokens in %.2f s\n",
                   req.remote_addr.c_str(), r->prompts.size(), static_cast<long long>(generated),
                   s);
    }
  }

  const LoadedModel& model() const { return m_; }

 private:
  const ServeFlags& f_;
  LoadedModel m_;
  std::mutex model_mu_;
  std::mt19937_64 seeds_;  // unseeded requests' seeds (under model_mu_)
  std::atomic<int> in_flight_{0};
};

int run(const ServeFlags& f) {
  if (f.port < 0 || f.port > 65535) {
    return command_failed(
        "serve", absl::InvalidArgumentError("--port must be in [0, 65535] (0: any free port)"));
  }
  if (f.max_concurrent < 1 || f.max_concurrent > 1024) {
    return command_failed("serve",
                          absl::InvalidArgumentError("--max-concurrent must be in [1, 1024]"));
  }
  if (f.max_request_tokens < 1 || f.max_request_bytes < 1) {
    return command_failed("serve",
                          absl::InvalidArgumentError(
                              "--max-request-tokens and --max-request-bytes must be positive"));
  }
  // SIGINT and SIGTERM: blocked here, before any thread starts (the model's
  // streams, the server's pool inherit the mask), and taken by `stopper`,
  // which stops the server (again and again until it has stopped: stop()
  // does nothing before the server runs) and unblocks them for itself, so
  // a second one ends the process at once.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  httplib::Server svr;
  std::atomic<bool> stop_requested{false}, done{false}, woken{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (woken.exchange(true)) return;  // run() woke it: the server has ended
    stop_requested = true;
    std::fprintf(stderr, "troupe serve: signal %d, stopping (another ends it at once)\n", sig);
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
    while (!done) {
      svr.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto finish = [&](int rc) {
    done = true;
    if (!woken.exchange(true)) pthread_kill(stopper.native_handle(), SIGTERM);  // wakes sigwait
    stopper.join();
    return rc;
  };

  absl::StatusOr<LoadedModel> m = load_model(f.model);
  if (!m.ok()) return finish(command_failed("serve", m.status()));
  if (stop_requested) return finish(0);
  Api api(f, std::move(*m));
  svr.new_task_queue = [n = f.max_concurrent] { return new httplib::ThreadPool(n + 4); };
  svr.set_payload_max_length(f.max_request_bytes);
  svr.set_read_timeout(5, 0);
  svr.set_write_timeout(10, 0);
  svr.set_keep_alive_timeout(2);
  // httplib bounds a body by its Content-Length only: a chunked one is refused.
  svr.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("Transfer-Encoding")) return httplib::Server::HandlerResponse::Unhandled;
    reply_error(res, 411, "send the body with a Content-Length (chunked bodies are refused)");
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.Put("/api",
          [&api](const httplib::Request& req, httplib::Response& res) { api.handle(req, res); });
  svr.Get("/health", [&api](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(json{{"status", "ok"}, {"model", api.model().description}}),
                    "application/json");
  });
  // httplib's own refusals (413, 404, a malformed request) get a JSON body too.
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const char* what = res.status == 413   ? "the request body is larger than --max-request-bytes"
                       : res.status == 404 ? "no such endpoint (PUT /api, GET /health)"
                                           : "bad request";
    res.set_content(dump(json{{"error", what}}), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                               std::exception_ptr) { reply_error(res, 500, "internal error"); });
  const int port = f.port == 0 ? svr.bind_to_any_port(f.host) : f.port;
  if (port < 0 || (f.port != 0 && !svr.bind_to_port(f.host, f.port))) {
    return finish(command_failed(
        "serve", absl::UnavailableError(absl::StrCat("--host ", f.host, " --port ", f.port,
                                                     ": cannot listen there"))));
  }
  std::fprintf(stderr, "troupe serve: %s\n", api.model().description.c_str());
  std::fprintf(stderr, "troupe serve: listening on http://%s:%d (PUT /api, GET /health)\n",
               f.host.c_str(), port);
  const bool ok = svr.listen_after_bind();
  return finish(ok || stop_requested ? 0 : 1);
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "HTTP text generation, compatible with Megatron's server (PUT /api)");
  add_model_flags(cmd, f->model);
  cmd->add_option("--host", f->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", f->port, "Port (0: any free port, printed)")->capture_default_str();
  cmd->add_option("--max-request-bytes", f->max_request_bytes, "Largest request body")
      ->capture_default_str();
  cmd->add_option("--max-concurrent", f->max_concurrent,
                  "Requests in progress at once, 1 to 1024 (more are answered 503)")
      ->capture_default_str();
  cmd->add_option("--max-request-tokens", f->max_request_tokens,
                  "Most tokens one request may need: its prompts' tokens and "
                  "tokens_to_generate for each")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seeds the requests that give no random_seed")
      ->capture_default_str();
  return [f] { return run(*f); };
}

}  // namespace troupe::launcher
