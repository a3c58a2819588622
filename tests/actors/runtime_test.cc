// The actors' training equals single-rank training: every (tp, pp, dp,
// schedule) with tp in {1, 2, 4}, pp in {1, 2, 4}, dp in {1, 2, 4},
// tp*pp*dp <= 8, gives the single-rank losses and gradient norms within 1e-5
// relative over 10 steps and the same parameters within 1e-4 (also with a
// vocabulary that tp does not divide); a layout run twice is bitwise the
// same; optimizer state per rank falls as 1/dp.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "actors/rank/timed_stage.h"
#include "actors/runtime/in_process.h"
#include "model/weights.h"
#include "tests/tiny_model.h"

namespace troupe::actors {
namespace {

// 8 layers, so that pp=4 with 2 chunks per stage splits evenly; a global
// batch of 32, so that m = 16/dp is a multiple of pp for the interleaved
// schedule.
model::TrainOptions layouts_tiny8(int V = 512) {
  return fixtures::tiny({.layers = 8,
                         .vocab = V,
                         .micro_batch = 2,
                         .global_batch = 32,
                         .steps = 10,
                         .warmup_iters = 2,
                         .decay_iters = 10});
}

struct Trained {
  std::vector<model::StepMetrics> metrics;
  std::vector<float> params;  // the whole model's, after the last step
};

// The single-rank reference, computed once per vocabulary size. The map
// owns the results (a static, destroyed at exit): LeakSanitizer once failed
// every Equivalence case on a reference that was allocated, copied into the
// map and never freed.
const Trained& reference(int V = 512) {
  static std::map<int, Trained> refs;
  if (auto it = refs.find(V); it != refs.end()) return it->second;
  Trained r;
  model::TrainOptions o = layouts_tiny8(V);
  auto t = model::Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int i = 0; t.ok() && i < o.steps; i++) {
    model::StepMetrics m;
    absl::Status st = (*t)->step(&m);
    EXPECT_TRUE(st.ok()) << st;
    r.metrics.push_back(m);
  }
  if (t.ok()) {
    const gpu::Tensor& p = (*t)->gpt().params();
    r.params.assign(p.data<float>(), p.data<float>() + p.numel());
  }
  return refs.emplace(V, std::move(r)).first->second;
}

Trained run_actors(const model::TrainOptions& o, const ParallelOptions& par) {
  Trained r;
  auto t = InProcessTrainer::create(o, par);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return r;
  absl::Status st = (*t)->run([&](const model::StepMetrics& m) { r.metrics.push_back(m); });
  EXPECT_TRUE(st.ok()) << st;
  // Gathered into the single-rank model (whose padding may differ: the TP
  // ranks pad to a multiple of 128 x tp), then compared row for row.
  model::Gpt whole((*t)->options().model, 1, gpu::cpu_device());
  st = (*t)->gather_params(whole);
  EXPECT_TRUE(st.ok()) << st;
  model::Gpt single(o.model, 1, gpu::cpu_device());
  for (const model::ParamSpec& spec : single.layout().specs()) {
    const model::ParamSpec& from = whole.layout().find(spec.name);
    const std::int64_t n = spec.real_rows * (spec.numel() / spec.shape[0]);
    std::copy_n(whole.params().data<float>() + from.offset, n,
                single.params().data<float>() + spec.offset);
    std::fill_n(single.params().data<float>() + spec.offset + n, spec.numel() - n, 0.0f);
  }
  r.params.assign(single.params().data<float>(),
                  single.params().data<float>() + single.params().numel());
  return r;
}

struct Case {
  int pp, dp;
  ScheduleKind kind;
  int v;
  int tp = 1;
  int V = 512;
  ParallelOptions parallel() const {
    return {{.tp = tp, .pp = pp, .dp = dp, .virtual_stages = v}, kind, {}};
  }
};

// ctest shows the parameter by this name (not as bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << "tp=" << c.tp << " pp=" << c.pp << " dp=" << c.dp << " " << schedule_name(c.kind)
      << " v=" << c.v << " V=" << c.V;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(c.tp > 1 ? absl::StrCat("tp", c.tp, "_") : "", "pp", c.pp, "_dp", c.dp, "_",
                      schedule_name(c.kind), c.v > 1 ? absl::StrCat("_v", c.v) : "",
                      c.V != 512 ? absl::StrCat("_V", c.V) : "");
}

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, MatchesSingleRankTraining) {
  const Case& c = GetParam();
  const Trained& ref = reference(c.V);
  const Trained got = run_actors(layouts_tiny8(c.V), c.parallel());
  ASSERT_EQ(ref.metrics.size(), static_cast<std::size_t>(layouts_tiny8().steps));
  ASSERT_EQ(got.metrics.size(), ref.metrics.size());
  double worst_loss = 0.0, worst_norm = 0.0;
  for (std::size_t i = 0; i < ref.metrics.size(); i++) {
    const model::StepMetrics &a = ref.metrics[i], &b = got.metrics[i];
    EXPECT_EQ(b.step, a.step);
    const double loss = std::abs(b.loss - a.loss) / std::abs(a.loss);
    const double norm = std::abs(b.grad_norm - a.grad_norm) / std::abs(a.grad_norm);
    EXPECT_LE(loss, 1e-5) << "step " << a.step;
    EXPECT_LE(norm, 1e-5) << "step " << a.step;
    EXPECT_EQ(b.lr, a.lr);
    worst_loss = std::max(worst_loss, loss);
    worst_norm = std::max(worst_norm, norm);
  }
  ASSERT_EQ(got.params.size(), ref.params.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.params.size(); i++) {
    worst = std::max(worst, static_cast<double>(std::abs(got.params[i] - ref.params[i])));
  }
  EXPECT_LE(worst, 1e-4);
  // The figures docs/ARCHITECTURE.md quotes.
  std::printf(
      "worst relative difference over %zu steps: loss %.2g, grad norm %.2g; "
      "parameters %.2g absolute\n",
      ref.metrics.size(), worst_loss, worst_norm, worst);
}

std::vector<Case> all_layouts() {
  std::vector<Case> out;
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 4}) {
      for (int dp : {1, 2, 4}) {
        if (tp * pp * dp > 8) continue;
        out.push_back({pp, dp, ScheduleKind::kGPipe, 1, tp});
        out.push_back({pp, dp, ScheduleKind::k1F1B, 1, tp});
        out.push_back({pp, dp, ScheduleKind::kInterleaved1F1B, 2, tp});
      }
    }
  }
  // V = 500: tp pads the vocabulary to 512 (a multiple of 128 x tp); the
  // padded columns take no part, so nothing depends on it.
  out.push_back({1, 1, ScheduleKind::k1F1B, 1, 4, 500});
  out.push_back({2, 1, ScheduleKind::k1F1B, 1, 2, 500});
  out.push_back({1, 2, ScheduleKind::kGPipe, 1, 2, 500});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Equivalence, ::testing::ValuesIn(all_layouts()), case_name);

// --init-weights scatters one file to every (s, t) slice and --save-weights
// gathers them back into the file one rank writes: start a 3D run and the
// single-rank run from the same file, save both, compare the files.
TEST(Runtime, WeightsFileInAndOutOf3DMatchesSingleRank) {
  const std::string dir = ::testing::TempDir();
  const std::string init = dir + "/init.safetensors", single_out = dir + "/single.safetensors",
                    multi_out = dir + "/multi.safetensors";
  model::TrainOptions o = layouts_tiny8(500);  // V = 500: tp = 2 pads to 512
  o.steps = 3;
  o.lr.decay_iters = 3;
  {
    model::Gpt g(o.model, 1, gpu::cpu_device());
    ASSERT_TRUE(g.init(99).ok());  // not the training seed: the file must be what is used
    ASSERT_TRUE(model::save_weights(g, init).ok());
  }
  o.init_weights = init;
  std::vector<model::StepMetrics> want;
  {
    auto t = model::Trainer::create(o);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < o.steps; i++) {
      model::StepMetrics m;
      ASSERT_TRUE((*t)->step(&m).ok());
      want.push_back(m);
    }
    ASSERT_TRUE(model::save_weights((*t)->gpt(), single_out).ok());
  }
  auto t = InProcessTrainer::create(o, {{.tp = 2, .pp = 2, .dp = 2}});
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<model::StepMetrics> got;
  ASSERT_TRUE((*t)->run([&](const model::StepMetrics& m) { got.push_back(m); }).ok());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); i++) {
    EXPECT_LE(std::abs(got[i].loss - want[i].loss) / want[i].loss, 1e-5);
  }
  {
    model::Gpt whole((*t)->options().model, 1, gpu::cpu_device());
    ASSERT_TRUE((*t)->gather_params(whole).ok());
    ASSERT_TRUE(model::save_weights(whole, multi_out).ok());
  }
  // Both files load into the single-rank model (V rows each) and agree.
  model::Gpt a(o.model, 1, gpu::cpu_device()), b(o.model, 1, gpu::cpu_device());
  ASSERT_TRUE(model::load_weights(single_out, a).ok());
  absl::Status st = model::load_weights(multi_out, b);
  ASSERT_TRUE(st.ok()) << st;
  double worst = 0.0;
  for (std::int64_t i = 0; i < a.params().numel(); i++) {
    worst = std::max(worst, static_cast<double>(std::abs(a.params().data<float>()[i] -
                                                         b.params().data<float>()[i])));
  }
  EXPECT_LE(worst, 1e-4);
  EXPECT_EQ(std::filesystem::file_size(single_out), std::filesystem::file_size(multi_out));
}

TEST(Runtime, ALayoutRunTwiceIsBitwiseTheSame) {
  for (const Case& c :
       {Case{2, 2, ScheduleKind::k1F1B, 1}, Case{4, 2, ScheduleKind::kInterleaved1F1B, 2},
        Case{2, 1, ScheduleKind::k1F1B, 1, 4}}) {
    const ParallelOptions par = c.parallel();
    const Trained a = run_actors(layouts_tiny8(), par), b = run_actors(layouts_tiny8(), par);
    ASSERT_EQ(a.metrics.size(), b.metrics.size());
    for (std::size_t i = 0; i < a.metrics.size(); i++) {
      EXPECT_EQ(std::memcmp(&a.metrics[i].loss, &b.metrics[i].loss, sizeof(double)), 0);
      EXPECT_EQ(std::memcmp(&a.metrics[i].grad_norm, &b.metrics[i].grad_norm, sizeof(double)), 0);
    }
    ASSERT_EQ(a.params.size(), b.params.size());
    EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)), 0);
  }
}

TEST(Runtime, ValidationLossMatchesSingleRank) {
  model::TrainOptions o = layouts_tiny8();
  o.steps = 4;
  o.lr.decay_iters = 4;
  o.eval_interval = 2;
  o.eval_iters = 2;
  std::vector<double> want;
  {
    auto t = model::Trainer::create(o);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < o.steps; i++) {
      model::StepMetrics m;
      ASSERT_TRUE((*t)->step(&m).ok());
      if (m.val_loss) want.push_back(*m.val_loss);
    }
  }
  ASSERT_EQ(want.size(), 2u);
  for (const Case& c : {Case{2, 2, ScheduleKind::k1F1B, 1}, Case{1, 4, ScheduleKind::kGPipe, 1},
                        Case{4, 1, ScheduleKind::kInterleaved1F1B, 2}}) {
    const Trained got =
        run_actors(o, {{.pp = c.pp, .dp = c.dp, .virtual_stages = c.v}, c.kind, {}});
    std::vector<double> val;
    for (const model::StepMetrics& m : got.metrics) {
      if (m.val_loss) val.push_back(*m.val_loss);
    }
    ASSERT_EQ(val.size(), want.size()) << "pp " << c.pp << " dp " << c.dp;
    for (std::size_t i = 0; i < val.size(); i++) {
      EXPECT_LE(std::abs(val[i] - want[i]) / want[i], 1e-5) << "pp " << c.pp << " dp " << c.dp;
    }
  }
}

TEST(Runtime, RunsInTheHostProgramsOwnActorSystem) {
  caf::actor_system_config cfg;
  add_message_types(cfg);  // before the system starts (CAF 0.17)
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system system{cfg};
  model::TrainOptions o = layouts_tiny8();
  o.steps = 2;
  auto t = InProcessTrainer::create(o, {{.pp = 2, .dp = 2}});
  ASSERT_TRUE(t.ok()) << t.status();
  int steps = 0;
  absl::Status st = (*t)->run(system, [&](const model::StepMetrics&) { steps++; });
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(steps, 2);
  // The host's system lives on, usable after the run.
  auto echo = system.spawn([]() -> caf::behavior { return {[](int x) { return x + 1; }}; });
  caf::scoped_actor self{system};
  self->request(echo, caf::infinite, 41)
      .receive([](int y) { EXPECT_EQ(y, 42); }, [](caf::error&) { FAIL(); });
  self->send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST(Runtime, AStepCallbackThatThrowsEndsTheRunWithAnError) {
  model::TrainOptions o = layouts_tiny8();
  o.steps = 3;
  auto t = InProcessTrainer::create(o, {{.pp = 2, .dp = 1}});
  ASSERT_TRUE(t.ok()) << t.status();
  absl::Status st = (*t)->run([](const model::StepMetrics&) {
    throw std::runtime_error("the host program's callback failed");
  });
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the host program's callback failed"), std::string::npos) << st;
}

// --debug-op-cost's fixed-cost chunks are laid out by the rank's tensor
// slice, as the real chunks: the partitions, the gradient buckets and the
// gathered model are cut from that layout (a tp 2 layout once ran off the
// end of the whole model's buffers).
TEST(Runtime, FixedCostChunksTakeTheRanksTensorSlice) {
  model::TrainOptions o = layouts_tiny8();
  o.steps = 2;
  auto t = InProcessTrainer::create(o, {{.tp = 2, .pp = 2, .dp = 2}},
                                    timed_stage_factory({.stages = {{.f = 0.1, .b = 0.1}}}));
  ASSERT_TRUE(t.ok()) << t.status();
  int steps = 0;
  absl::Status st = (*t)->run([&](const model::StepMetrics& m) {
    steps++;
    EXPECT_EQ(m.loss, 0.0f);  // the fixed-cost ops compute nothing
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(steps, 2);
  model::Gpt whole((*t)->options().model, 1, gpu::cpu_device());
  EXPECT_TRUE((*t)->gather_params(whole).ok());
  // The chunk itself: rank t's slice of every parameter, as a real chunk's.
  const model::GptConfig& c = (*t)->options().model;
  const model::StageSpec first = model::StageSpec::pipeline(c, 2, 0);
  for (int tp_rank : {0, 1}) {
    const model::TpSlice slice{2, tp_rank};
    std::unique_ptr<GptStage> chunk = timed_stage_factory({.stages = {{.f = 0, .b = 0}}})(
        {.config = c, .B = 2, .spec = first, .slots = 1, .tp = slice});
    const std::int64_t sliced = model::ParamLayout::gpt(c, first, slice).total();
    EXPECT_EQ(chunk->params().numel(), sliced);
    EXPECT_EQ(chunk->grads().numel(), sliced);
    EXPECT_LT(sliced, model::ParamLayout::gpt(c, first).total());
  }
}

// ZeRO-1: every byte the optimizer side allocates (master, Adam m and v, the
// replicas' sum, the staging of their gradients, norms), as the device
// counts it, falls as 1/dp: the staging is a window of two ranges, not one
// range per replica. With pp = 2 the embedding chunk also stages the head's
// wte shares.
TEST(Runtime, OptimizerMemoryPerRankFallsAsOneOverDp) {
  const model::TrainOptions o = layouts_tiny8();
  const std::int64_t whole = 3 * model::ParamLayout::gpt(o.model).total() * 4;
  for (int pp : {1, 2}) {
    // Stage s's rank with dp = 1: its state, and every optimizer byte.
    std::vector<std::int64_t> state1(static_cast<std::size_t>(pp)), all1(state1);
    for (int dp : {1, 2, 4}) {
      auto t = InProcessTrainer::create(o, {{.pp = pp, .dp = dp}});
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ((*t)->unpartitioned_state_bytes(), whole);
      std::int64_t state = 0;
      for (int s = 0; s < pp; s++) {
        for (int d = 0; d < dp; d++) {
          const int r = (*t)->layout().rank({.d = d, .s = s, .t = 0});
          const std::int64_t st = (*t)->optimizer_state_bytes(r);
          const std::int64_t all = (*t)->optimizer_bytes(r);
          state += st;
          if (dp == 1) {
            state1[static_cast<std::size_t>(s)] = st;
            all1[static_cast<std::size_t>(s)] = all;
          }
          const std::string where =
              absl::StrCat("pp ", pp, " dp ", dp, " rank ", r, ": ", all, " bytes, ",
                           all1[static_cast<std::size_t>(s)], " at dp 1");
          EXPECT_NEAR(static_cast<double>(st),
                      static_cast<double>(state1[static_cast<std::size_t>(s)]) / dp, 12.0 * 16)
              << where;
          EXPECT_GE(all, st) << where;
          // State 3 ranges + sum 1 + staging 1 at dp = 1 (5), 2 from dp = 2
          // on: 6/dp of the same range, so at most 1.2/dp of dp = 1's.
          EXPECT_LE(static_cast<double>(all),
                    1.2 * static_cast<double>(all1[static_cast<std::size_t>(s)]) / dp + 1024)
              << where;
        }
      }
      EXPECT_EQ(state, whole);  // every parameter's state is held exactly once
    }
  }
}

TEST(Runtime, StashesOnlyWhatTheScheduleKeepsInFlight) {
  // 1F1B at pp=4: stage s keeps min(pp - s, m) micro-batches (+1 slot so a
  // gradient still leaving does not stall the next forward); GPipe keeps m.
  model::TrainOptions o = layouts_tiny8();
  auto t = InProcessTrainer::create(o, {{.pp = 4, .dp = 1}, ScheduleKind::k1F1B});
  ASSERT_TRUE(t.ok()) << t.status();
  for (int s = 0; s < 4; s++) EXPECT_EQ((*t)->slots(s, 0), 4 - s + 1) << "stage " << s;
  auto g = InProcessTrainer::create(o, {{.pp = 4, .dp = 1}, ScheduleKind::kGPipe});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->slots(0, 0), 16 + 1);
  // Interleaved, pp = 2, v = 2, m = 4: per chunk, the peaks counted by hand
  // in Megatron's order (schedule_test.cc, InterleavedInMegatronOrder):
  // stage 0 keeps 4 of chunk 0 and 2 of chunk 1, stage 1 keeps 3 and 1.
  o.global_batch = 8;
  auto v = InProcessTrainer::create(
      o, {{.pp = 2, .dp = 1, .virtual_stages = 2}, ScheduleKind::kInterleaved1F1B});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)->slots(0, 0), 4 + 1);
  EXPECT_EQ((*v)->slots(0, 1), 2 + 1);
  EXPECT_EQ((*v)->slots(1, 0), 3 + 1);
  EXPECT_EQ((*v)->slots(1, 1), 1 + 1);
}

TEST(Runtime, LayoutsThatDoNotFitAreClearErrors) {
  model::TrainOptions o = layouts_tiny8();
  auto expect_error = [&](const ParallelOptions& par, const std::string& text) {
    auto t = InProcessTrainer::create(o, par);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(text), std::string::npos) << t.status();
  };
  expect_error({{.pp = 3}}, "--layers 8 does not split into --pp 3");
  expect_error({{.tp = 3}}, "--heads 4 does not divide among --tp 3 tensor-parallel ranks");
  expect_error({{.pp = 1, .dp = 3}}, "--global-batch-size 32 must be a multiple of");
  expect_error({{.pp = 2, .virtual_stages = 2}}, "--virtual-stages 2 needs --schedule interleaved");
}

}  // namespace
}  // namespace troupe::actors
