// Tensor parallelism on the CPU backend: communication volume against
// Megatron's formula, and step time for tp = 1, 2, 4.
//
//   volume   floats each TP rank all-reduces per layer and micro-batch,
//            measured as the difference between a run with 2L and one with
//            L layers (so the embedding and LM head's share drops out),
//            against Megatron's 4 all-reduces of B*T*C per layer (2 in the
//            forward: attention and MLP projections; 2 in the backward: the
//            inputs of the column-parallel qkv and c_fc)
//   step     cpu-small, every rank in this process, the cores shared
//            equally among the ranks' streams
//
// One JSON object per measurement, then a table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "actors/runtime/in_process.h"

namespace troupe {
namespace {

model::TrainOptions cpu_small(int L, int B, int m, int steps, int threads) {
  model::TrainOptions o;
  o.model = *model::preset("cpu-small");
  o.model.L = L;
  o.micro_batch = B;
  o.global_batch = B * m;
  o.steps = steps;
  o.threads = threads;
  return o;
}

struct Result {
  std::vector<double> step_s;
  std::int64_t floats = 0;  // rank 0's TP all-reduce volume over the run
};

Result run(const model::TrainOptions& o, int tp) {
  auto t = actors::InProcessTrainer::create(o, {{.tp = tp}});
  if (!t.ok()) {
    std::fprintf(stderr, "tp_bench: %s\n", std::string(t.status().message()).c_str());
    std::exit(1);
  }
  Result r;
  absl::Status st = (*t)->run([&](const model::StepMetrics& m) { r.step_s.push_back(m.step_s); });
  if (!st.ok()) {
    std::fprintf(stderr, "tp_bench: %s\n", std::string(st.message()).c_str());
    std::exit(1);
  }
  r.floats = (*t)->tp_all_reduced_floats(0);
  return r;
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  using namespace troupe;
  CLI::App app{"tensor parallelism: comm volume and step time"};
  int B = 4, steps = 3, threads = 0;
  app.add_option("--micro-batch-size", B, "B")->capture_default_str();
  app.add_option("--steps", steps, "Steps per step-time measurement")->capture_default_str();
  app.add_option("--threads", threads, "Cores shared by all ranks (default: all)");
  CLI11_PARSE(app, argc, argv);

  // Volume: 1 step, m = 2 micro-batches, L = 2 and 4 layers.
  const int m = 2;
  struct Volume {
    int tp;
    double measured, megatron;
  };
  std::vector<Volume> volumes;
  for (int tp : {2, 4}) {
    const auto short_run = run(cpu_small(2, B, m, 1, threads), tp);
    const auto long_run = run(cpu_small(4, B, m, 1, threads), tp);
    const model::GptConfig c = *model::preset("cpu-small");
    const double per_layer = static_cast<double>(long_run.floats - short_run.floats) / (2.0 * m);
    const double formula = 4.0 * B * c.T * c.C;
    volumes.push_back({tp, per_layer, formula});
    std::printf(
        "{\"bench\": \"tp_volume\", \"tp\": %d, \"B\": %d, \"T\": %d, \"C\": %d, "
        "\"floats_per_layer_per_micro_batch\": %.0f, \"megatron\": %.0f}\n",
        tp, B, c.T, c.C, per_layer, formula);
    std::fflush(stdout);
  }

  // Step time, cpu-small (L = 4), tp = 1, 2, 4.
  std::vector<std::pair<int, double>> steps_s;
  for (int tp : {1, 2, 4}) {
    Result r = run(cpu_small(4, B, 1, steps, threads), tp);
    std::sort(r.step_s.begin(), r.step_s.end());
    const double median = r.step_s[r.step_s.size() / 2];
    steps_s.emplace_back(tp, median);
    std::printf(
        "{\"bench\": \"tp_step\", \"model\": \"cpu-small\", \"tp\": %d, \"B\": %d, "
        "\"step_s\": %.6f, \"tokens_per_s\": %.1f}\n",
        tp, B, median, B * 256 / median);
    std::fflush(stdout);
  }

  std::printf("\n%-4s %28s %16s %8s\n", "tp", "all-reduced floats/layer/mb", "Megatron 4BTC",
              "ratio");
  for (const Volume& v : volumes) {
    std::printf("%-4d %28.0f %16.0f %8.3f\n", v.tp, v.measured, v.megatron,
                v.measured / v.megatron);
  }
  std::printf("\n%-4s %10s %12s\n", "tp", "step s", "vs tp=1");
  for (auto [tp, s] : steps_s) std::printf("%-4d %10.3f %11.2fx\n", tp, s, steps_s[0].second / s);
  return 0;
}
