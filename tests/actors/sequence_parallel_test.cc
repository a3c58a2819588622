// Sequence parallelism: every tested tp layout trains as the same layout
// without it within 1e-5 over 10 steps (the sums over the TP group run in
// another order, so not bitwise), with recompute too; and the LayerNorm and
// residual regions' activations fall by tp, by the device's byte count
// against the tensors worked out by hand; and the LayerNorm gradients are
// summed over the TP group once a step, in its last backward.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "actors/diagnostics/trace_file.h"
#include "actors/rank/memory_plan.h"
#include "actors/runtime/in_process.h"
#include "tests/tiny_model.h"

namespace troupe::actors {
namespace {

using model::ActivationOptions;
using model::Recompute;

model::TrainOptions sp_tiny8(const ActivationOptions& a) {
  return fixtures::tiny({.layers = 8,
                         .micro_batch = 2,
                         .global_batch = 8,
                         .steps = 10,
                         .warmup_iters = 2,
                         .decay_iters = 10,
                         .activations = a});
}

std::vector<model::StepMetrics> run(const model::TrainOptions& o, const ParallelOptions& par) {
  std::vector<model::StepMetrics> out;
  auto t = InProcessTrainer::create(o, par);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return out;
  absl::Status st = (*t)->run([&](const model::StepMetrics& m) { out.push_back(m); });
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

TEST(SequenceParallel, EqualsPlainTensorParallelismWithin1e5) {
  struct Case {
    ParallelOptions par;
    Recompute recompute = Recompute::kNone;
  };
  const std::vector<Case> cases = {
      {{{.tp = 2}}},
      {{{.tp = 4}}},
      {{{.tp = 2, .pp = 2}}},
      {{{.tp = 2, .dp = 2}}},
      {{{.tp = 2, .pp = 2, .virtual_stages = 2}, ScheduleKind::kInterleaved1F1B}},
      {{{.tp = 2, .pp = 2}}, Recompute::kFull},
      {{{.tp = 2, .pp = 2}}, Recompute::kSelective},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("tp ", c.par.tp, " pp ", c.par.pp, " dp ", c.par.dp, " v ",
                              c.par.virtual_stages, " recompute ",
                              model::recompute_name(c.recompute)));
    const std::vector<model::StepMetrics> want = run(sp_tiny8({.recompute = c.recompute}), c.par);
    const std::vector<model::StepMetrics> got =
        run(sp_tiny8({.recompute = c.recompute, .sequence_parallel = true}), c.par);
    ASSERT_EQ(got.size(), 10u);
    ASSERT_EQ(want.size(), 10u);
    for (std::size_t i = 0; i < want.size(); i++) {
      EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss)) << "step " << i + 1;
      EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-5 * want[i].grad_norm)
          << "step " << i + 1;
    }
  }
}

// Per micro-batch and token, the regions keep per layer ln1, residual2, ln2
// and residual3 (4C) and the two LayerNorms' mean and rstd (4); the first
// stage its embedding's output (C), the last the final LayerNorm's output,
// mean and rstd (C + 2), every stage the gradient it hands back (C).
// Sequence parallelism keeps 1/tp of each; nothing else changes.
TEST(SequenceParallel, TheRegionsActivationsFallByTp) {
  for (const char* name : {"tiny", "cpu-small"}) {
    for (int tp : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(name, " tp ", tp));
      model::GptConfig c = *model::preset(name);
      c.vocab_multiple *= tp;  // as the runtime slices it
      const std::int64_t B = 2, N = B * c.T, C = c.C, L = c.L;
      auto slot = [&](bool sp) {
        model::TensorParallel slice;
        slice.slice = {tp, 0};
        model::Gpt g(c, static_cast<int>(B), gpu::cpu_device(), model::StageSpec::whole(c), 1,
                     slice, {.sequence_parallel = sp});
        return g.activation_bytes_per_slot() / 4;
      };
      const std::int64_t regions = N * (L * (4 * C + 4) + C + (C + 2) + C);
      EXPECT_EQ(slot(false) - slot(true), regions - regions / tp);
      std::printf("%s tp %d: %.2f MiB a micro-batch without sequence parallelism, %.2f with\n",
                  name, tp, slot(false) * 4.0 / (1 << 20), slot(true) * 4.0 / (1 << 20));
    }
  }
}

// What the chunks allocate with sequence parallelism is the counted memory
// (which the planner and --print-config use).
TEST(SequenceParallel, CountedMemoryIsWhatTheRanksAllocate) {
  model::TrainOptions o = sp_tiny8({.sequence_parallel = true});
  o.steps = 0;
  const ParallelOptions par{{.tp = 2, .pp = 2}};
  auto t = InProcessTrainer::create(o, par);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int r = 0; r < par.world(); r++) {
    const comm::Coord at = (*t)->layout().coord(r);
    const RankUnit::ActivationBytes got = (*t)->activation_bytes(r);
    absl::StatusOr<MemoryParts> want = counted_memory({.config = o.model,
                                                       .parallel = par,
                                                       .micro_batch = o.micro_batch,
                                                       .global_batch = o.global_batch,
                                                       .stage = at.s,
                                                       .sequence_parallel = true});
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_NEAR(want->activations / static_cast<double>(got.per_micro_batch * (*t)->slots(r, 0)),
                1.0, 1e-9);
    EXPECT_NEAR(want->total() / static_cast<double>((*t)->allocated_bytes(r)), 1.0, 0.01);
  }
}

TEST(SequenceParallel, NeedsTensorParallelism) {
  const model::TrainOptions o = sp_tiny8({.sequence_parallel = true});
  EXPECT_EQ(ParallelOptions{{.pp = 2}}.validate(o).message(),
            "--sequence-parallel needs --tp of at least 2");
}

// Each rank's rows give a part of every LayerNorm's weight and bias
// gradients. The parts are summed over the micro-batches and then once over
// the TP group in the step's last backward (Megatron's finalize_model_grads):
// one all-reduce of 4C floats per layer (ln1 and ln2) and one of 2C for the
// head's final LayerNorm (on the last stage, or stage 0 in zbv's V), all in
// micro-batch m - 1's backward; none in W.
TEST(SequenceParallel, TheLayerNormGradientsAreSummedOverTheTpGroupOnceAStep) {
  for (ScheduleKind schedule : {ScheduleKind::k1F1B, ScheduleKind::kZbH1, ScheduleKind::kZbV}) {
    SCOPED_TRACE(schedule_name(schedule));
    const std::string dir = (std::filesystem::temp_directory_path() /
                             absl::StrCat("troupe-sp-ln-", schedule_name(schedule), "-", getpid()))
                                .string();
    std::filesystem::remove_all(dir);
    const int m = 4;
    model::TrainOptions o = fixtures::tiny({.layers = 4,
                                            .micro_batch = 1,
                                            .global_batch = m,
                                            .steps = 2,
                                            .activations = {.sequence_parallel = true}});
    TraceOptions trace;
    trace.dir = dir;
    trace.first_step = trace.last_step = 2;
    ParallelOptions par{{.tp = 2, .pp = 2}};
    par.schedule = schedule;
    ASSERT_TRUE(place_for_schedule(schedule, &par).ok());
    const int head_stage = schedule == ScheduleKind::kZbV ? 0 : 1;
    auto t = InProcessTrainer::create(o, par, nullptr, {}, trace);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->run([](const model::StepMetrics&) {}).ok());
    const std::int64_t C = o.model.C;
    for (int r = 0; r < 4; r++) {
      std::ifstream in(std::filesystem::path(dir) / trace_file_name(r));
      ASSERT_TRUE(in) << "rank " << r;
      std::string line;
      std::getline(in, line);
      const int s = nlohmann::json::parse(line)["s"];
      int layer_sums = 0, head_sums = 0;
      while (std::getline(in, line)) {
        const nlohmann::json e = nlohmann::json::parse(line);
        if (e["k"] != "collective" || e["op"] != "all_reduce") continue;
        const std::int64_t bytes = e["bytes"];
        if (bytes != 16 * C && bytes != 8 * C) continue;
        EXPECT_EQ(e["mb"], m - 1) << e.dump();
        (bytes == 16 * C ? layer_sums : head_sums)++;
      }
      EXPECT_EQ(layer_sums, 2) << "rank " << r;  // 2 layers a stage
      EXPECT_EQ(head_sums, s == head_stage ? 1 : 0) << "rank " << r;
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace troupe::actors
