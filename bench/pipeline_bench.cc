// The pipeline runtime's own overhead, measured with ops of fixed cost.
//
// Every model chunk's forward and backward is a timed sleep on its stage's
// stream (so 2 shared cores do not distort it); everything else is the real
// runtime: shard actors walking their schedules, activations and gradients
// over the in-process transport, ZeRO-1 partitions, the coordinator.
//
//   bubble   1F1B, GPipe and interleaved at pp=4, m=16: the idle fraction of
//            a stage, 1 - (time its ops took) / (step time), averaged over
//            the stages, against the theory (pp-1)/(m+pp-1), and
//            (pp-1)/(v*m+pp-1) interleaved. The ops' own time is measured
//            (a sleep overshoots a little), so the difference to the theory
//            is what the runtime adds.
//   hop      zero-cost ops, m=1, pp = 1, 2, 4, 8: the step time grows by one
//            activation hop and one gradient hop per stage; the slope is the
//            runtime's cost of a stage round trip
//
// One JSON object per measurement on stdout, then a table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "actors/rank/timed_stage.h"
#include "actors/runtime/in_process.h"

namespace troupe {
namespace {

model::TrainOptions options(int L, int m, int steps) {
  model::TrainOptions o;
  o.model = *model::preset("tiny");
  o.model.L = L;
  o.model.C = 8;
  o.model.NH = 1;
  o.model.T = 4;
  o.model.V = 16;
  o.micro_batch = 1;
  o.global_batch = m;
  o.steps = steps;
  o.threads = 1;
  return o;
}

struct Measured {
  std::vector<double> step_s;
  double busy_s = 0;  // all stages' op time over the run
};

// A run with the given op costs per chunk.
Measured run(int pp, int m, actors::ScheduleKind kind, int v, actors::OpCosts costs, int steps) {
  std::atomic<std::int64_t> busy_ns{0};
  const actors::StageFactory factory = actors::timed_stage_factory(std::move(costs), &busy_ns);
  actors::ParallelOptions par{{.pp = pp, .dp = 1, .virtual_stages = v}, kind};
  if (absl::Status st = actors::place_for_schedule(kind, &par); !st.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", std::string(st.message()).c_str());
    std::exit(1);
  }
  const model::TrainOptions o = options(pp * par.virtual_stages, m, steps);
  auto t = actors::InProcessTrainer::create(o, par, factory);
  if (!t.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", std::string(t.status().message()).c_str());
    std::exit(1);
  }
  Measured out;
  absl::Status st = (*t)->run([&](const model::StepMetrics& s) { out.step_s.push_back(s.step_s); });
  if (!st.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", std::string(st.message()).c_str());
    std::exit(1);
  }
  out.busy_s = static_cast<double>(busy_ns.load()) * 1e-9;
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  using namespace troupe;
  CLI::App app{"pipeline runtime overhead with fixed-cost ops"};
  double op_ms = 10;
  int steps = 3, hop_steps = 200;
  app.add_option("--op-ms", op_ms, "Cost of each forward and backward (per stage)")
      ->capture_default_str();
  app.add_option("--steps", steps, "Steps per bubble measurement")->capture_default_str();
  app.add_option("--hop-steps", hop_steps, "Steps per hop measurement")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const int pp = 4, m = 16;
  struct Row {
    const char* name;
    actors::ScheduleKind kind;
    int v;
    double measured, theory;
  };
  std::vector<Row> rows = {{"1f1b", actors::ScheduleKind::k1F1B, 1, 0, 0},
                           {"gpipe", actors::ScheduleKind::kGPipe, 1, 0, 0},
                           {"interleaved", actors::ScheduleKind::kInterleaved1F1B, 2, 0, 0}};
  for (Row& r : rows) {
    // Per-stage work is the same for every schedule: v chunks of op_ms/v.
    const double chunk_ms = op_ms / r.v;
    const Measured got =
        run(pp, m, r.kind, r.v, {.stages = {{chunk_ms, chunk_ms / 2, chunk_ms / 2}}}, steps);
    double total = 0;
    for (double x : got.step_s) total += x;
    const double step = total / static_cast<double>(got.step_s.size());
    const double work = got.busy_s / (pp * static_cast<double>(got.step_s.size()));  // per stage
    r.measured = 1.0 - work / step;
    r.theory = static_cast<double>(pp - 1) / (r.v * m + pp - 1);
    std::printf(
        "{\"bench\": \"bubble\", \"schedule\": \"%s\", \"pp\": %d, \"m\": %d, \"v\": %d, "
        "\"op_ms\": %.3f, \"op_s_per_stage\": %.6f, \"step_s\": %.6f, \"bubble\": %.6f, "
        "\"theory\": %.6f}\n",
        r.name, pp, m, r.v, chunk_ms, work, step, r.measured, r.theory);
    std::fflush(stdout);
  }

  // Zero-cost ops: step time against the number of stages.
  std::vector<std::pair<int, double>> hops;
  for (int stages : {1, 2, 4, 8}) {
    std::vector<double> t =
        run(stages, 1, actors::ScheduleKind::k1F1B, 1, {.stages = {{}}}, hop_steps).step_s;
    t.erase(t.begin(), t.begin() + std::min<std::size_t>(10, t.size() / 2));  // warm-up
    const double us = median(t) * 1e6;
    hops.emplace_back(stages, us);
    std::printf("{\"bench\": \"hop\", \"pp\": %d, \"m\": 1, \"step_us\": %.2f}\n", stages, us);
    std::fflush(stdout);
  }
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : hops) {
    sx += x;
    sy += y;
    sxx += static_cast<double>(x) * x;
    sxy += x * y;
  }
  const double n = static_cast<double>(hops.size());
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  std::printf(
      "{\"bench\": \"hop_cost\", \"us_per_stage_round_trip\": %.2f, \"us_per_hop\": %.2f}\n", slope,
      slope / 2);

  std::printf("\n%-12s %6s %10s %10s %8s\n", "schedule", "v", "bubble", "theory", "diff");
  for (const Row& r : rows) {
    const double diff = 100 * (r.measured - r.theory);
    std::printf("%-12s %6d %9.2f%% %9.2f%% %+7.2fpp%s\n", r.name, r.v, 100 * r.measured,
                100 * r.theory, diff, std::abs(diff) <= 2.0 ? "" : "  (target: within 2pp)");
  }
  std::printf(
      "\nruntime cost per pipeline stage (activation forward + gradient back): %.1f us "
      "(%.1f us per hop)\n",
      slope, slope / 2);
  return 0;
}
