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
//   zb       the zero-bubble schedules beside 1F1B and interleaved: at pp=4,
//            m=8 with F = B = W, each one's bubble against its theory (ZB-H1's
//            (p-1)(F+B-W) of idle, the V's least (p-1) chunk forwards);
//            then at pp 4 and 8, m=16, each one's step time with equal
//            stage costs, with unequal ones (stage s x (1 + s/(p-1)/2)) and
//            with every op's time varied by +-50% (seeded), and zb-auto's
//            speed (on 1F1B's stages, and on zbv's V: zb-auto-v) against
//            the best static schedule of the same run. Every schedule does
//            the same work per stage (chunks of v cost 1/v). Each runs
//            max(--steps, 2pp + 4) steps and its step is the mean of the
//            last half (zb-auto's steady state, once it has measured).
//
// One JSON object per measurement on stdout, then a table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
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
  // Four layers a chunk: zb-auto runs a W a layer at a time.
  const model::TrainOptions o = options(4 * pp * par.virtual_stages, m, steps);
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

// The mean of the last half of the steps: zb-auto learns its input gaps
// over the steps (a stage's choices change its neighbours' gaps, so it
// takes about pp steps), and a long run sees its steady state.
double steady_step(const Measured& m) {
  const std::size_t n = m.step_s.size(), from = n / 2;
  double total = 0;
  for (std::size_t i = from; i < n; i++) total += m.step_s[i];
  return total / static_cast<double>(n - from);
}

// Steps of a zero-bubble measurement at pp stages.
int zb_steps(int steps, int pp) { return std::max(steps, 2 * pp + 4); }

struct ZbSchedule {
  const char* name;
  actors::ScheduleKind kind;
  int v;
};
const ZbSchedule kZbSchedules[] = {{"1f1b", actors::ScheduleKind::k1F1B, 1},
                                   {"interleaved", actors::ScheduleKind::kInterleaved1F1B, 2},
                                   {"zb-h1", actors::ScheduleKind::kZbH1, 1},
                                   {"zbv", actors::ScheduleKind::kZbV, 2},
                                   {"zb-auto", actors::ScheduleKind::kZbAuto, 1},
                                   {"zb-auto-v", actors::ScheduleKind::kZbAuto, 2}};

// Each stage's F:B:W for op_ms a third each, chunks of 1/v of it.
actors::OpCosts zb_costs(int pp, int v, double op_ms, bool unequal, double jitter) {
  actors::OpCosts c{.stages = {}, .jitter = jitter, .seed = 7};
  for (int s = 0; s < pp; s++) {
    const double x = op_ms / v * (unequal ? 1 + 0.5 * s / std::max(1, pp - 1) : 1.0);
    c.stages.push_back({x, x, x});
  }
  return c;
}

// The schedule's bubble in theory with F = B = W (per chunk).
double zb_theory(actors::ScheduleKind kind, int pp, int m, int v) {
  const double p1 = pp - 1;
  switch (kind) {
    case actors::ScheduleKind::kZbAuto:
      if (v == 2) return p1 / (6.0 * m + p1);  // on a V: ZB-V's
      return p1 / (3.0 * m + p1);
    case actors::ScheduleKind::kZbH1:
      return p1 / (3.0 * m + p1);  // (p-1)(F+B-W) / (m(F+B+W) + (p-1)(F+B-W))
    case actors::ScheduleKind::kZbV:
      return p1 / (6.0 * m + p1);  // (p-1)F / (2m(F+B+W) + (p-1)F)
    default:
      return p1 / (v * m + p1);
  }
}

void zero_bubble(double op_ms, int steps) {
  // Bubbles at pp 4, m 8, F = B = W.
  std::printf("\n%-12s %9s %9s %8s\n", "schedule", "bubble", "theory", "diff");
  for (const ZbSchedule& z : kZbSchedules) {
    const int pp = 4, m = 8;
    const Measured got =
        run(pp, m, z.kind, z.v, zb_costs(pp, z.v, op_ms, false, 0), zb_steps(steps, pp));
    const double step = steady_step(got);
    const double work = got.busy_s / (pp * static_cast<double>(got.step_s.size()));
    const double bubble = 1.0 - work / step, theory = zb_theory(z.kind, pp, m, z.v);
    std::printf(
        "{\"bench\": \"zb_bubble\", \"schedule\": \"%s\", \"pp\": %d, \"m\": %d, \"v\": %d, "
        "\"op_ms\": %.3f, \"step_s\": %.6f, \"bubble\": %.6f, \"theory\": %.6f}\n",
        z.name, pp, m, z.v, op_ms, step, bubble, theory);
    std::printf("%-12s %8.2f%% %8.2f%% %+7.2fpp\n", z.name, 100 * bubble, 100 * theory,
                100 * (bubble - theory));
    std::fflush(stdout);
  }
  // Step times at m 16: equal, unequal and jittered stage costs.
  struct Shape {
    const char* name;
    bool unequal;
    double jitter;
  };
  const Shape shapes[] = {{"equal", false, 0}, {"unequal", true, 0}, {"jitter50", false, 0.5}};
  std::printf("\n%-4s %-9s", "pp", "costs");
  for (const ZbSchedule& z : kZbSchedules) std::printf(" %11s", z.name);
  std::printf(" %10s %10s\n", "auto/best", "autoV/best");
  for (int pp : {4, 8}) {
    for (const Shape& sh : shapes) {
      const int m = 16;
      double best_static = 0, automatic = 0, automatic_v = 0;
      std::printf("%-4d %-9s", pp, sh.name);
      for (const ZbSchedule& z : kZbSchedules) {
        const Measured got =
            run(pp, m, z.kind, z.v, zb_costs(pp, z.v, op_ms, sh.unequal, sh.jitter),
                zb_steps(steps, pp));
        const double step = steady_step(got);
        if (z.kind == actors::ScheduleKind::kZbAuto) {
          (z.v == 2 ? automatic_v : automatic) = step;
        } else if (best_static == 0 || step < best_static) {
          best_static = step;
        }
        std::printf(" %9.1fms", step * 1e3);
        std::fflush(stdout);
      }
      std::printf(" %9.3fx %9.3fx\n", best_static / automatic, best_static / automatic_v);
      std::printf(
          "{\"bench\": \"zb_auto\", \"pp\": %d, \"m\": %d, \"costs\": \"%s\", "
          "\"best_static_step_s\": %.6f, \"zb_auto_step_s\": %.6f, \"speed\": %.4f, "
          "\"zb_auto_v_step_s\": %.6f, \"speed_v\": %.4f}\n",
          pp, m, sh.name, best_static, automatic, best_static / automatic, automatic_v,
          best_static / automatic_v);
      std::fflush(stdout);
    }
  }
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
  std::string only;
  app.add_option("--only", only, "Run one part: bubble, hop or zb");
  CLI11_PARSE(app, argc, argv);
  if (only == "zb") {
    zero_bubble(op_ms, std::max(steps, 2) + 1);
    return 0;
  }

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
  zero_bubble(op_ms, std::max(steps, 2) + 1);
  return 0;
}
