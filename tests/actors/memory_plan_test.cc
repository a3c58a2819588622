// The planner's memory per rank: the counted mode against what the runtime
// allocates (the device's byte count, an independent measurement), and the
// paper mode's per-layer formulas against Korthikanti et al.'s Table 2,
// worked out by hand.
#include "actors/rank/memory_plan.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "actors/runtime/in_process.h"
#include "model/gpt.h"

namespace troupe::actors {
namespace {

model::TrainOptions cpu_small(int B, int global_batch) {
  model::TrainOptions o;
  o.model = *model::preset("cpu-small");
  // cpu-small's shapes but a vocabulary of 4001 (padded to 4096): the
  // embedding's 50257 rows made drawing the initial weights 90% of the time.
  o.model.V = 4001;
  o.micro_batch = B;
  o.global_batch = global_batch;
  o.steps = 1;
  return o;
}

// Every rank of each layout allocates what counted_memory says for its
// stage, within 1% (the token buffers are made when the actors are spawned,
// so the runtime's count before a run lacks those few KiB; the bound
// is 10%).
TEST(MemoryPlan, CountedIsWhatTheRuntimeAllocates) {
  struct Case {
    ParallelOptions par;
    int L;
    gpu::Precision precision = gpu::Precision::kFp32;
  };
  const std::vector<Case> cases = {
      {{}, 4},
      {{{.pp = 2}}, 4},
      {{{.dp = 2}}, 4},
      {{{.tp = 2}}, 4},
      {{{.tp = 2, .pp = 2}}, 4},
      {{{.pp = 2, .virtual_stages = 2}, ScheduleKind::kInterleaved1F1B}, 4},
      {{{.tp = 2, .dp = 2}}, 4, gpu::Precision::kBf16},  // bf16 tensors, fp32 collectives' buffers
      {{{.pp = 2}}, 4, gpu::Precision::kFp16},
      // Weight stashes (zero-bubble schedules).
      {{{.pp = 2}, ScheduleKind::kZbH1}, 4},
      {{{.pp = 2, .virtual_stages = 2, .v_shape = true}, ScheduleKind::kZbV}, 4},
      {{{.tp = 2, .pp = 2}, ScheduleKind::kZbAuto, 3}, 4, gpu::Precision::kBf16},
  };
  for (const Case& c : cases) {
    model::TrainOptions o = cpu_small(2, 8);
    o.model.L = c.L;
    o.activations.precision = c.precision;
    auto t = InProcessTrainer::create(o, c.par);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int r = 0; r < c.par.world(); r++) {
      const comm::Coord at = (*t)->layout().coord(r);
      MemoryQuery q{
          .config = o.model, .parallel = c.par, .micro_batch = 2, .global_batch = 8, .stage = at.s};
      q.precision = c.precision;
      absl::StatusOr<MemoryParts> want = counted_memory(q);
      ASSERT_TRUE(want.ok()) << want.status();
      const double got = static_cast<double>((*t)->allocated_bytes(r));
      const std::string where = absl::StrCat("tp ", c.par.tp, " pp ", c.par.pp, " dp ", c.par.dp,
                                             " v ", c.par.virtual_stages, " rank ", r);
      EXPECT_NEAR(want->total() / got, 1.0, 0.01)
          << where << ": counted " << want->total() << " bytes, allocated " << got;
    }
  }
}

// bf16 halves what a micro-batch keeps between its forward and backward
// (its LayerNorm statistics and losses stay fp32): the bytes the model
// allocates, fp32 against bf16.
TEST(MemoryPlan, Bf16HalvesTheActivationsOfAMicroBatch) {
  const model::GptConfig c = *model::preset("cpu-small");
  auto per_slot = [&](gpu::Precision p) {
    model::ActivationOptions a;
    a.precision = p;
    model::Gpt g(c, 2, gpu::cpu_device(), model::StageSpec::whole(c), 1, {}, a);
    return static_cast<double>(g.activation_bytes_per_slot());
  };
  const double ratio = per_slot(gpu::Precision::kBf16) / per_slot(gpu::Precision::kFp32);
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.51) << "bf16 keeps " << ratio << " of fp32's activation bytes";
}

TEST(MemoryPlan, CountedRefusesWhatTheRuntimeCannotDo) {
  MemoryQuery q{
      .config = *model::preset("cpu-small"), .parallel = {}, .micro_batch = 2, .global_batch = 8};
  q.sequence_parallel = true;  // needs tp > 1
  EXPECT_EQ(counted_memory(q).status().code(), absl::StatusCode::kInvalidArgument);
  q.sequence_parallel = false;
  q.global_batch = 7;
  EXPECT_EQ(counted_memory(q).status().code(), absl::StatusCode::kInvalidArgument);
}

// Korthikanti et al. 2022, Table 2, at MT-NLG's s = 2048, h = 20480, a = 128,
// t = 8, b = 1: 5as/h = 64, so (in units of sbh) none: 10 + 24/8 + 64/8 =
// 21; sequence parallel: (34 + 64)/8 = 12.25; selective: 10 + 3 = 13;
// selective with sequence parallel: 34/8 = 4.25; full: 2; full with
// sequence parallel: 2/8.
TEST(MemoryPlan, PaperLayerBytesAreTable2) {
  const double s = 2048, b = 1, h = 20480, a = 128, sbh = s * b * h;
  auto bytes = [&](Recompute r, bool sp) {
    return paper_layer_activation_bytes(s, b, h, a, 8, r, sp) / sbh;
  };
  EXPECT_DOUBLE_EQ(bytes(Recompute::kNone, false), 21);
  EXPECT_DOUBLE_EQ(bytes(Recompute::kNone, true), 12.25);
  EXPECT_DOUBLE_EQ(bytes(Recompute::kSelective, false), 13);
  EXPECT_DOUBLE_EQ(bytes(Recompute::kSelective, true), 4.25);
  EXPECT_DOUBLE_EQ(bytes(Recompute::kFull, false), 2);
  EXPECT_DOUBLE_EQ(bytes(Recompute::kFull, true), 0.25);
  // No parallelism: 34 + 5as/h.
  EXPECT_DOUBLE_EQ(paper_layer_activation_bytes(s, b, h, a, 1, Recompute::kNone, false) / sbh,
                   34 + 64);
}

// The first 1F1B stage holds pp micro-batches, the last one: a stage's
// activations in the paper mode scale with the schedule's in-flight count.
TEST(MemoryPlan, PaperCountsTheSchedulesInFlightMicroBatches) {
  model::GptConfig c = *model::preset("gpt2-124m");
  ParallelOptions par{{.pp = 4}};
  model::AttentionKernel kernel = model::AttentionKernel::kReference;  // the paper's 5as/h
  auto acts = [&](int stage) {
    absl::StatusOr<MemoryParts> m = paper_memory({.config = c,
                                                  .parallel = par,
                                                  .micro_batch = 1,
                                                  .global_batch = 16,
                                                  .stage = stage,
                                                  .attention = kernel});
    EXPECT_TRUE(m.ok()) << m.status();
    return m->activations;
  };
  const double layer = paper_layer_activation_bytes(1024, 1, 768, 12, 1, Recompute::kNone, false);
  // Stage 1 has 3 layers and 3 micro-batches in flight; stage 2 two.
  EXPECT_DOUBLE_EQ(acts(1), 3 * 3 * layer);
  EXPECT_DOUBLE_EQ(acts(2), 2 * 3 * layer);
  // Flash attention keeps no scores: a layer is the selective one's.
  kernel = model::AttentionKernel::kFlash;
  EXPECT_DOUBLE_EQ(
      acts(1),
      3 * 3 * paper_layer_activation_bytes(1024, 1, 768, 12, 1, Recompute::kSelective, false));
  kernel = model::AttentionKernel::kReference;
  // GPipe's last stage holds all 16, each with the head's 4sbh(1 + v/h).
  par.schedule = ScheduleKind::kGPipe;
  const double head = 4.0 * 1024 * 768 * (1 + 50304.0 / 768);
  EXPECT_DOUBLE_EQ(acts(3), 16 * (3 * layer + head));
}

}  // namespace
}  // namespace troupe::actors
