// The preprocessing pipeline: a reader (this thread) hands batches of lines to
// a pool of tokenizing workers (one BpeEncoder and its cache each) and writes
// their results in input order, so the output does not depend on --workers.
#include "model/data/preprocess.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "model/data/bpe.h"
#include "model/data/indexed_dataset.h"
#include "model/data/line_reader.h"

namespace troupe::model::data {
namespace {

struct Line {
  std::int64_t number;
  std::string text;
};

struct Document {
  std::int64_t line = 0;
  std::string error;                           // non-empty: a bad line
  std::string meta;                            // split_by_meta value
  std::vector<std::vector<std::int32_t>> ids;  // per json key
};

struct Batch {
  std::vector<Line> lines;
};

// Fixed workers, each with its own encoder; tasks run in submission order
// of whichever worker is free, results come back through futures.
class TokenizerPool {
 public:
  TokenizerPool(const Gpt2Vocab& vocab, int workers) {
    for (int i = 0; i < workers; i++) {
      threads_.emplace_back([this, &vocab] {
        BpeEncoder encoder(vocab);
        for (;;) {
          std::function<void(BpeEncoder&)> task;
          {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
            if (tasks_.empty()) return;
            task = std::move(tasks_.front());
            tasks_.pop_front();
          }
          task(encoder);
        }
      });
    }
  }
  ~TokenizerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void(BpeEncoder&)> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(BpeEncoder&)>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

std::string short_reason(const std::string& what) {
  if (what.find("UTF-8") != std::string::npos) return "invalid UTF-8";
  // nlohmann: "[json.exception.parse_error.101] parse error at line 1, column 5: ..."
  const std::size_t colon = what.find("column");
  return absl::StrCat("invalid JSON (", colon == std::string::npos ? what : what.substr(colon),
                      ")");
}

Document tokenize_line(const Line& line, const PreprocessOptions& o, const Gpt2Vocab& vocab,
                       BpeEncoder& enc) {
  Document doc;
  doc.line = line.number;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.text);
  } catch (const nlohmann::json::exception& e) {
    doc.error = short_reason(e.what());
    return doc;
  }
  if (!j.is_object()) {
    doc.error = "not a JSON object";
    return doc;
  }
  if (!o.split_by_meta.empty()) {
    auto meta = j.find("meta");
    if (meta == j.end() || !meta->is_object() || !meta->contains(o.split_by_meta) ||
        !(*meta)[o.split_by_meta].is_string()) {
      doc.error = absl::StrCat("no string meta.", o.split_by_meta);
      return doc;
    }
    doc.meta = (*meta)[o.split_by_meta].get<std::string>();
  }
  for (const std::string& key : o.json_keys) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
      doc.error = absl::StrCat("no string '", key, "'");
      return doc;
    }
    std::vector<std::int32_t> ids;
    absl::Status st = enc.encode(it->get_ref<const std::string&>(), &ids);
    if (!st.ok()) {
      doc.error = std::string(st.message());
      return doc;
    }
    if (o.append_eod && !ids.empty()) ids.push_back(vocab.eod());
    doc.ids.push_back(std::move(ids));
  }
  return doc;
}

// Meta values become part of file names.
std::string file_safe(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.';
    out.push_back(ok ? c : '_');
  }
  return out.empty() ? "_" : out;
}

}  // namespace

absl::StatusOr<PreprocessReport> preprocess(
    const PreprocessOptions& o, const std::function<void(const PreprocessProgress&)>& on_progress,
    const std::function<void(const BadLine&)>& on_bad_line) {
  if (o.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  if (o.json_keys.empty()) return absl::InvalidArgumentError("--json-keys needs at least one key");
  if (o.output_prefix.empty()) return absl::InvalidArgumentError("--output-prefix is required");
  auto vocab = Gpt2Vocab::load(o.vocab_file, o.merge_file);
  if (!vocab.ok()) return vocab.status();
  auto reader = LineReader::open(o.input);
  if (!reader.ok()) return reader.status();
  const TokenDType dtype = token_dtype_for_vocab((*vocab)->size());

  PreprocessReport report;
  std::map<std::string, std::unique_ptr<IndexedDatasetBuilder>> builders;
  auto builder_for = [&](const std::string& meta,
                         const std::string& key) -> absl::StatusOr<IndexedDatasetBuilder*> {
    std::string prefix = o.output_prefix + "_";
    if (!o.split_by_meta.empty()) prefix += file_safe(meta) + "_";
    prefix += key + "_document";
    auto& b = builders[prefix];
    if (b == nullptr) {
      b = std::make_unique<IndexedDatasetBuilder>();
      absl::Status st = b->open(prefix, dtype);
      if (!st.ok()) return st;
    }
    return b.get();
  };

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last_report = t0;
  auto progress = [&](bool force) {
    const auto now = Clock::now();
    if (!on_progress || (!force && now - last_report < std::chrono::milliseconds(500))) return;
    last_report = now;
    report.totals.input_bytes = (*reader)->bytes_read();
    report.totals.input_size = (*reader)->file_size();
    report.totals.elapsed_s = std::chrono::duration<double>(now - t0).count();
    on_progress(report.totals);
  };

  // Writes one finished batch; fails on a write error or too many bad lines.
  auto write = [&](std::vector<Document>& docs) -> absl::Status {
    for (Document& d : docs) {
      report.totals.lines++;
      if (!d.error.empty()) {
        report.totals.bad_lines++;
        report.bad.push_back({d.line, d.error});
        if (on_bad_line) on_bad_line(report.bad.back());
        if (report.totals.bad_lines > o.max_bad_lines) {
          return absl::InvalidArgumentError(absl::StrCat(o.input, ": more than --max-bad-lines ",
                                                         o.max_bad_lines, " bad lines (line ",
                                                         d.line, ": ", d.error, ")"));
        }
        continue;
      }
      for (std::size_t k = 0; k < o.json_keys.size(); k++) {
        // An empty text is still a document (one without sequences), as
        // Megatron's add_document(ids=[], lengths=[]): the .idx stays
        // byte-identical to Megatron's.
        if (d.ids[k].empty()) report.empty_documents++;
        auto b = builder_for(d.meta, o.json_keys[k]);
        if (!b.ok()) return b.status();
        absl::Status st = (*b)->add_document(d.ids[k]);
        if (!st.ok()) return st;
        report.tokens += static_cast<std::int64_t>(d.ids[k].size());
      }
      report.totals.documents++;
    }
    return absl::OkStatus();
  };

  TokenizerPool pool(**vocab, o.workers);
  std::deque<std::future<std::vector<Document>>> in_flight;
  const std::size_t max_in_flight = static_cast<std::size_t>(2 * o.workers + 1);
  constexpr std::size_t kBatchLines = 256;
  std::int64_t line_no = 0;
  bool more = true;
  absl::Status status;
  while (status.ok() && (more || !in_flight.empty())) {
    if (more && in_flight.size() < max_in_flight) {
      auto batch = std::make_shared<Batch>();
      std::string line;
      while (batch->lines.size() < kBatchLines && (more = (*reader)->next(&line))) {
        line_no++;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
        batch->lines.push_back({line_no, std::move(line)});
      }
      auto promise = std::make_shared<std::promise<std::vector<Document>>>();
      in_flight.push_back(promise->get_future());
      const Gpt2Vocab& v = **vocab;
      pool.submit([batch, promise, &o, &v](BpeEncoder& enc) {
        std::vector<Document> docs;
        docs.reserve(batch->lines.size());
        for (const Line& l : batch->lines) docs.push_back(tokenize_line(l, o, v, enc));
        promise->set_value(std::move(docs));
      });
      continue;
    }
    std::vector<Document> docs = in_flight.front().get();
    in_flight.pop_front();
    status = write(docs);
    progress(false);
  }
  for (auto& f : in_flight) f.wait();  // let workers finish before the pool goes
  if (!status.ok()) return status;
  if (!(*reader)->status().ok()) return (*reader)->status();
  for (auto& [prefix, b] : builders) {
    absl::Status st = b->finish();
    if (!st.ok()) return st;
    report.documents_by_output[prefix] = b->documents();
  }
  progress(true);
  return report;
}

}  // namespace troupe::model::data
