// One training step of a GPT (default cpu-small, B=8) timed on troupe's CPU
// backend, with the GEMM peak measured in the same run, as JSON lines:
//   {"impl":"gemm-peak", "gflops": ...}
//   {"impl":"troupe", "step_s": median, "tokens_per_s": ..., "gflops": ..., "of_peak": ...}
// scripts/bench train runs it side by side with bench/train_torch.py.
//
// With --precisions fp32,bf16 (scripts/bench precision) it times one
// trainer per precision instead, their steps interleaved so that both see
// the same machine, one line each and their ratio:
//   {"precision": "fp32", "tokens_per_s": ..., "step_s": ..., "vs_fp32": 1}
//   {"precision": "bf16", "tokens_per_s": ..., "step_s": ..., "vs_fp32": ...}
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpu/cpu/cpu_kernels.h"
#include "model/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best GFLOP/s of a square sgemm on `threads` threads (the GEMM peak the
// step's figure is compared with).
double gemm_peak(int threads, int n, int reps) {
  omp_set_num_threads(threads);
  std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  double best = 0;
  for (int r = 0; r < reps; r++) {
    auto t0 = Clock::now();
    troupe::gpu::cpu::sgemm('N', 'T', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

troupe::model::TrainOptions options(const troupe::model::GptConfig& config, int B, int threads,
                                    int steps) {
  troupe::model::TrainOptions o;
  o.model = config;
  o.micro_batch = B;
  o.global_batch = B;
  o.steps = steps;
  o.threads = threads;
  return o;
}

// One trainer per precision, a step of each in turn; median step times.
int compare_precisions(const troupe::model::GptConfig& config, const std::string& model, int B,
                       int threads, int steps, int warmup, const std::vector<std::string>& names) {
  std::vector<std::unique_ptr<troupe::model::Trainer>> trainers;
  for (const std::string& name : names) {
    troupe::model::TrainOptions o = options(config, B, threads, warmup + steps);
    if (name == "bf16") {
      o.activations.precision = troupe::gpu::Precision::kBf16;
    } else if (name == "fp16") {
      o.activations.precision = troupe::gpu::Precision::kFp16;
    } else if (name != "fp32") {
      std::fprintf(stderr, "--precisions: '%s' is not fp32, bf16 or fp16\n", name.c_str());
      return 2;
    }
    auto t = troupe::model::Trainer::create(o);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    trainers.push_back(std::move(*t));
  }
  std::vector<std::vector<double>> times(names.size());
  for (int i = 0; i < warmup + steps; i++) {
    for (std::size_t k = 0; k < trainers.size(); k++) {
      troupe::model::StepMetrics m;
      if (absl::Status st = trainers[k]->step(&m); !st.ok()) {
        std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
        return 1;
      }
      if (i >= warmup) times[k].push_back(m.step_s);
    }
  }
  const double tokens = static_cast<double>(B) * config.T;
  const double base = tokens / median(times[0]);
  for (std::size_t k = 0; k < names.size(); k++) {
    const double step_s = median(times[k]);
    std::printf(
        "{\"precision\": \"%s\", \"model\": \"%s\", \"B\": %d, \"T\": %d, \"threads\": %d, "
        "\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"vs_%s\": %.3f}\n",
        names[k].c_str(), model.c_str(), B, config.T, threads, step_s, tokens / step_s,
        names[0].c_str(), tokens / step_s / base);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe training-step benchmark"};
  std::string model = "cpu-small";
  int B = 8, threads = 2, steps = 5, warmup = 2;
  app.add_option("--model", model)->capture_default_str();
  app.add_option("--micro-batch-size", B)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  std::vector<std::string> precisions;
  app.add_option("--precisions", precisions, "compare these (fp32,bf16,fp16), the first the base")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  if (!precisions.empty()) {
    auto config = troupe::model::preset(model);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    return compare_precisions(*config, model, B, threads, steps, warmup, precisions);
  }

  const double peak = gemm_peak(threads, 2048, 5);
  std::printf(
      "{\"impl\": \"gemm-peak\", \"threads\": %d, \"shape\": \"2048^3\", \"gflops\": %.1f}\n",
      threads, peak);

  auto config = troupe::model::preset(model);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  troupe::model::TrainOptions o = options(*config, B, threads, warmup + steps);
  auto trainer = troupe::model::Trainer::create(o);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str());
    return 1;
  }
  std::vector<double> times;
  for (int i = 0; i < warmup + steps; i++) {
    troupe::model::StepMetrics m;
    absl::Status st = (*trainer)->step(&m);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return 1;
    }
    if (i >= warmup) times.push_back(m.step_s);
  }
  const double step_s = median(times);
  const double tokens = static_cast<double>(B) * o.model.T;
  const double gflops = o.model.flops_per_token(o.model.T) * tokens / step_s / 1e9;
  std::printf(
      "{\"impl\": \"troupe\", \"model\": \"%s\", \"B\": %d, \"T\": %d, \"threads\": %d, "
      "\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"gflops\": %.1f, \"of_peak\": %.3f}\n",
      model.c_str(), B, o.model.T, threads, step_s, tokens / step_s, gflops, gflops / peak);
  return 0;
}
