// The progress line and the metrics JSONL of a training run.
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/train_flags.h"
#include "model/atomic_file.h"

namespace troupe::api {

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<std::int64_t>(s + 0.5);
  if (total >= 3600) return absl::StrFormat("%dh%02dm", total / 3600, (total / 60) % 60);
  if (total >= 60) return absl::StrFormat("%dm%02ds", total / 60, total % 60);
  return absl::StrFormat("%.1fs", s);
}

int default_log_interval(int steps) { return steps <= 100 ? 1 : (steps + 50) / 100; }

Progress::Progress(int steps, std::vector<std::ofstream*> metrics, int log_interval)
    : steps_(steps),
      metrics_(std::move(metrics)),
      interval_(log_interval > 0 ? log_interval : default_log_interval(steps)),
      terminal_(isatty(STDOUT_FILENO) == 1) {}

void Progress::print(const model::StepMetrics& m, double loss, double tokens_per_s, double step_s) {
  const double eta = elapsed_ / reported_ * (steps_ - m.step);
  const std::string val = m.val_loss ? absl::StrFormat(" | val loss %.4f", *m.val_loss) : "";
  // --fp16 (Megatron's line has both): the scale, and the run's steps
  // skipped so far (the scaler's count: a resumed run's too).
  const std::string scale =
      m.loss_scale != 1 || m.skipped_steps > 0
          ? absl::StrFormat(" | loss scale %.1f | skipped %d", m.loss_scale, m.skipped_steps)
          : "";
  std::printf(
      "%sstep %*d/%d | loss %.4f | lr %.3e | grad norm %.4f%s | %.0f tok/s | %.3f s/step | "
      "elapsed %s | ETA %s%s",
      live_ ? "\r\033[K" : "", static_cast<int>(std::to_string(steps_).size()), m.step, steps_,
      loss, m.lr, m.grad_norm, scale.c_str(), tokens_per_s, step_s, duration(elapsed_).c_str(),
      duration(eta).c_str(), val.c_str());
}

void Progress::report(const model::StepMetrics& m) {
  elapsed_ += m.step_s;
  reported_++;  // (a resumed run's first step is not step 1)
  window_++;
  window_loss_ += m.loss;
  window_s_ += m.step_s;
  window_tokens_ += m.tokens_per_s * m.step_s;
  last_ = m;
  if (m.step % interval_ == 0 || m.step >= steps_) {
    end_window();
  } else if (m.val_loss) {
    // Between lines: the validation loss gets a line of its own.
    std::printf("%sstep %*d/%d | val loss %.4f\n", live_ ? "\r\033[K" : "",
                static_cast<int>(std::to_string(steps_).size()), m.step, steps_, *m.val_loss);
    live_ = false;
  } else if (terminal_) {
    print(m, m.loss, m.tokens_per_s, m.step_s);  // the live line: this step alone
    live_ = true;
  }
  std::fflush(stdout);
  // loss, grad_norm and lr with 17 digits: exactly, so that two
  // runs can be compared bit for bit.
  const std::string line = absl::StrFormat(
      "{\"step\": %d, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g, "
      "\"global_batch_size\": %d, \"consumed_samples\": %d, "
      "\"tokens_per_s\": %.9g, \"step_s\": %.9g, \"elapsed_s\": %.9g, \"loss_scale\": %.9g, "
      "\"skipped\": %s, \"skipped_steps\": %d%s}\n",
      m.step, m.loss, m.grad_norm, m.lr, m.global_batch, m.consumed_samples, m.tokens_per_s,
      m.step_s, elapsed_, m.loss_scale, m.skipped ? "true" : "false", m.skipped_steps,
      m.val_loss ? absl::StrFormat(", \"val_loss\": %.17g", *m.val_loss) : "");
  lines_.emplace_back(m.step, line);
  for (std::ofstream* out : metrics_) {
    if (out == nullptr) continue;
    *out << line;
    out->flush();
  }
}

void Progress::end_window() {
  const model::StepMetrics& m = last_;
  print(m, window_loss_ / window_, window_s_ > 0 ? window_tokens_ / window_s_ : m.tokens_per_s,
        window_s_ / window_);
  std::printf("\n");
  live_ = false;
  window_ = 0;
  window_loss_ = window_s_ = window_tokens_ = 0.0;
}

void Progress::finish() {
  if (window_ > 0) end_window();
  std::fflush(stdout);
}

void Progress::rewind(int step, std::vector<std::ofstream*> metrics) {
  // The steps after `step` run again: the window restarts with them.
  if (live_) std::printf("\n");
  live_ = false;
  window_ = 0;
  window_loss_ = window_s_ = window_tokens_ = 0.0;
  while (!lines_.empty() && lines_.back().first > step) lines_.pop_back();
  metrics_ = std::move(metrics);
  for (std::ofstream* out : metrics_) {
    if (out == nullptr) continue;
    for (const auto& [s, line] : lines_) *out << line;
    out->flush();
  }
}

std::string Progress::jsonl() const {
  std::string out;
  for (const auto& [step, line] : lines_) out += line;
  return out;
}

absl::Status write_trace_metrics(const TrainFlags& f, const Progress& progress) {
  if (f.trace.dir.empty()) return absl::OkStatus();
  absl::StatusOr<model::AtomicFile> file =
      model::AtomicFile::create(f.trace.dir + "/metrics.jsonl");
  if (!file.ok()) return file.status();
  if (absl::Status st = file->write(progress.jsonl()); !st.ok()) return st;
  return file->commit();
}

}  // namespace troupe::api
