// One training step of a GPT (default cpu-small, B=8) timed on troupe's CPU
// backend, with the GEMM peak measured in the same run, as JSON lines:
//   {"impl":"gemm-peak", "gflops": ...}
//   {"impl":"troupe", "step_s": median, "tokens_per_s": ..., "gflops": ..., "of_peak": ...}
// scripts/bench train runs it side by side with bench/train_torch.py.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
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
  CLI11_PARSE(app, argc, argv);

  const double peak = gemm_peak(threads, 2048, 5);
  std::printf(
      "{\"impl\": \"gemm-peak\", \"threads\": %d, \"shape\": \"2048^3\", \"gflops\": %.1f}\n",
      threads, peak);

  troupe::model::TrainOptions o;
  auto config = troupe::model::preset(model);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  o.model = *config;
  o.micro_batch = B;
  o.global_batch = B;
  o.steps = warmup + steps;
  o.threads = threads;
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
