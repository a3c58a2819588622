// Activation recompute in the actors' runtime: a tp x pp layout trains
// bitwise as the same layout without recompute (the recompute's TP
// collectives come in the same order on every peer), and what each rank's
// chunks allocate for activations is the planner's counted memory.
#include <gtest/gtest.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "actors/rank/memory_plan.h"
#include "actors/runtime/in_process.h"
#include "tests/tiny_model.h"

namespace troupe::actors {
namespace {

using model::ActivationOptions;
using model::Recompute;
using model::RecomputeMethod;

model::TrainOptions recompute_tiny8(const ActivationOptions& a) {
  return fixtures::tiny({.layers = 8,
                         .micro_batch = 2,
                         .global_batch = 8,
                         .steps = 3,
                         .warmup_iters = 1,
                         .activations = a});
}

struct Trained {
  std::vector<model::StepMetrics> metrics;
  std::vector<float> params;
};

Trained run(const ActivationOptions& a, const ParallelOptions& par) {
  Trained r;
  auto t = InProcessTrainer::create(recompute_tiny8(a), par);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return r;
  absl::Status st = (*t)->run([&](const model::StepMetrics& m) { r.metrics.push_back(m); });
  EXPECT_TRUE(st.ok()) << st;
  model::Gpt whole((*t)->options().model, 1, gpu::cpu_device());
  EXPECT_TRUE((*t)->gather_params(whole).ok());
  r.params.assign(whole.params().data<float>(),
                  whole.params().data<float>() + whole.params().numel());
  return r;
}

TEST(RecomputeRuntime, ATpPpLayoutIsBitwiseTheSameWithEveryMode) {
  for (const ParallelOptions& par :
       {ParallelOptions{{.tp = 2, .pp = 2}},
        ParallelOptions{{.tp = 2, .pp = 2, .virtual_stages = 2}, ScheduleKind::kInterleaved1F1B}}) {
    SCOPED_TRACE(absl::StrCat("tp 2 pp 2 v ", par.virtual_stages));
    // (Selective recompute recomputes something with the reference attention
    // kernel only: that run against the reference kernel's without.)
    const Trained want_flash = run({}, par);
    const Trained want_reference = run({.attention = model::AttentionKernel::kReference}, par);
    for (const ActivationOptions& a :
         {ActivationOptions{.recompute = Recompute::kSelective,
         .attention = model::AttentionKernel::kReference},
          ActivationOptions{.recompute = Recompute::kFull},
          ActivationOptions{.recompute = Recompute::kFull, .recompute_layers = 2},
          ActivationOptions{.recompute = Recompute::kFull,
          .method = RecomputeMethod::kBlock,
          .recompute_layers = 1}}) {
      SCOPED_TRACE(a.describe());
      const Trained got = run(a, par);
      const Trained& want =
          a.attention == model::AttentionKernel::kReference ? want_reference : want_flash;
      ASSERT_EQ(got.metrics.size(), want.metrics.size());
      for (std::size_t i = 0; i < want.metrics.size(); i++) {
        EXPECT_EQ(std::memcmp(&got.metrics[i].loss, &want.metrics[i].loss, sizeof(double)), 0)
            << "step " << i + 1;
        EXPECT_EQ(
            std::memcmp(&got.metrics[i].grad_norm, &want.metrics[i].grad_norm, sizeof(double)), 0)
            << "step " << i + 1;
      }
      ASSERT_EQ(got.params.size(), want.params.size());
      EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4), 0);
    }
  }
}

// Each rank's activations as its chunks allocated them (slots x one slot,
// plus the recompute workspace) against counted_memory's for its stage,
// within 10% (the bound; they agree exactly when both follow
// RankUnit).
TEST(RecomputeRuntime, ActivationsAllocatedAreTheCountedMemory) {
  for (const ActivationOptions& a :
       {ActivationOptions{}, ActivationOptions{.recompute = Recompute::kSelective},
        ActivationOptions{.recompute = Recompute::kSelective,
        .attention = model::AttentionKernel::kReference},
        ActivationOptions{.attention = model::AttentionKernel::kReference},
        ActivationOptions{.recompute = Recompute::kFull},
        ActivationOptions{.recompute = Recompute::kFull,
        .method = RecomputeMethod::kBlock,
        .recompute_layers = 1}}) {
    for (const ParallelOptions& par : {ParallelOptions{}, ParallelOptions{{.tp = 2, .pp = 2}}}) {
      model::TrainOptions o = recompute_tiny8(a);
      o.model = *model::preset("cpu-small");
      o.model.V = 4001;  // padded to 4096; 50257 rows made the initial weights most of the time
      o.steps = 0;
      auto t = InProcessTrainer::create(o, par);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int r = 0; r < par.world(); r++) {
        const comm::Coord at = (*t)->layout().coord(r);
        const RankUnit::ActivationBytes got = (*t)->activation_bytes(r);
        const double allocated =
            static_cast<double>(got.per_micro_batch * (*t)->slots(r, 0) + got.workspace);
        absl::StatusOr<MemoryParts> want = counted_memory({.config = o.model,
                                                           .parallel = par,
                                                           .micro_batch = o.micro_batch,
                                                           .global_batch = o.global_batch,
                                                           .stage = at.s,
                                                           .recompute = a.recompute,
                                                           .recompute_method = a.method,
                                                           .recompute_layers = a.recompute_layers,
                                                           .attention = a.attention});
        ASSERT_TRUE(want.ok()) << want.status();
        EXPECT_NEAR(want->activations / allocated, 1.0, 0.10)
            << a.describe() << ", tp " << par.tp << " pp " << par.pp << ", rank " << r;
      }
    }
  }
}

// gpt2-124m's shapes (B = 1, T = 1024): one chunk's activations as the
// device counts them (one slot and the workspace; nothing is initialised or
// trained) against counted_memory for a one-rank layout, whose schedule
// holds one micro-batch.
TEST(RecomputeRuntime, Gpt2ShapesAllocateTheCountedMemory) {
  const model::GptConfig c = *model::preset("gpt2-124m");
  for (const ActivationOptions& a :
       {ActivationOptions{}, ActivationOptions{.recompute = Recompute::kSelective},
        ActivationOptions{.recompute = Recompute::kSelective,
        .attention = model::AttentionKernel::kReference},
        ActivationOptions{.attention = model::AttentionKernel::kReference},
        ActivationOptions{.recompute = Recompute::kFull},
        ActivationOptions{.recompute = Recompute::kFull, .recompute_layers = 4},
        ActivationOptions{.recompute = Recompute::kFull,
        .method = RecomputeMethod::kBlock,
        .recompute_layers = 3}}) {
    model::Gpt g(c, 1, gpu::cpu_device(), model::StageSpec::whole(c), 1, {}, a);
    const double allocated =
        static_cast<double>(g.activation_bytes_per_slot() + g.recompute_workspace_bytes());
    absl::StatusOr<MemoryParts> want = counted_memory({.config = c,
                                                       .parallel = {},
                                                       .micro_batch = 1,
                                                       .global_batch = 1,
                                                       .stage = 0,
                                                       .recompute = a.recompute,
                                                       .recompute_method = a.method,
                                                       .recompute_layers = a.recompute_layers,
                                                       .attention = a.attention});
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_NEAR(want->activations / allocated, 1.0, 0.10) << a.describe();
  }
}

}  // namespace
}  // namespace troupe::actors
