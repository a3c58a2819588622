// The planner: the simulated step against the pipeline schedules' closed
// forms (Megatron's), the collectives and the chunks' costs against
// hand-computed formulas, the report against published runs
// (plan_hardware_test.cc: the cluster files and the GEMM curve;
// plan_p2p_test.cc: Megatron's point-to-point).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "actors/schedule.h"
#include "launcher/plan/clusters.h"
#include "launcher/plan/cost.h"
#include "launcher/plan/hardware.h"
#include "launcher/plan/report.h"
#include "launcher/plan/sim.h"
#include "tests/plan/fixed_costs.h"
#include "tests/plan/selene.h"

namespace troupe::launcher::plan {
namespace {

// Megatron's step times (Narayanan et al. 2021): GPipe and 1F1B take
// (m + p - 1)(f + b) with f, b a stage's whole forward and backward; the
// interleaved schedule (m v + p - 1)(f + b) / v; the bubble is
// (p - 1)/(m + p - 1), or (p - 1)/(v m + p - 1).
TEST(PlanSim, StepTimesAreTheSchedulesClosedForms) {
  struct Case {
    int L, pp, m, v;
    actors::ScheduleKind kind;
  };
  const std::vector<Case> cases = {{4, 4, 8, 1, actors::ScheduleKind::k1F1B},
                                   {4, 4, 8, 1, actors::ScheduleKind::kGPipe},
                                   {8, 4, 8, 2, actors::ScheduleKind::kInterleaved1F1B},
                                   {6, 2, 5, 1, actors::ScheduleKind::k1F1B},
                                   {35, 35, 120, 1, actors::ScheduleKind::k1F1B}};
  for (const Case& c : cases) {
    const PlanInput in = layout(c.L, c.pp, c.m, c.kind, c.v);
    const double f = 1.0, b = 2.0;
    absl::StatusOr<SimResult> r = simulate(in, FixedCosts(f, b), false);
    ASSERT_TRUE(r.ok()) << r.status();
    const double layers = static_cast<double>(c.L) / c.pp;  // per stage
    const double F = f * layers, B = b * layers;
    const double want = (c.m * c.v + c.pp - 1) * (F + B) / c.v;
    EXPECT_NEAR(r->step_s, want, 1e-9) << "L=" << c.L << " pp=" << c.pp << " m=" << c.m;
    EXPECT_NEAR(r->bubble, (c.pp - 1.0) / (c.v * c.m + c.pp - 1.0), 1e-12);
  }
}

// Per layer f forward, b input gradient (B) and w weight gradient (W), in
// pieces of a layer; nothing else costs anything.
class SplitCosts final : public Costs {
 public:
  SplitCosts(double f, double b, double w) : f_(f), b_(b), w_(w) {}
  ChunkCost chunk(const model::StageSpec& spec) const override {
    ChunkCost c;
    c.fwd = f_ * spec.layers();
    c.bwd = (b_ + w_) * spec.layers();
    c.bwd_w = w_ * spec.layers();
    c.w_pieces = spec.layers();
    return c;
  }
  double p2p_seconds(int, int) const override { return 0; }
  double dp_reduce_seconds(int, double) const override { return 0; }
  double dp_gather_seconds(int, double) const override { return 0; }
  double optimizer_seconds(double) const override { return 0; }

 private:
  double f_, b_, w_;
};

// Qi et al. (ICLR 2024): ZB-H1's step is m(F + B + W) + (p - 1)(F + B - W)
// with F, B, W a stage's (m >= p); ZB-V's, at F = B = W, 6m + p - 1 chunk
// ops (m >= 2p - 1: the last stage waits p - 1 chunk forwards for its
// first input, and then never). zb-auto, once its measurements hold
// still, does no worse than ZB-H1, whose order it keeps for F and B, and
// on the V it reaches ZB-V's least.
TEST(PlanSim, ZeroBubbleStepTimesAreThePapersClosedForms) {
  struct Case {
    int L, pp, m;
    double f, b, w;
  };
  const std::vector<Case> cases = {{4, 4, 8, 1, 1, 1},
                                   {4, 4, 8, 1, 2, 1},
                                   {8, 4, 16, 2, 3, 1},
                                   {8, 8, 12, 1, 1, 1},
                                   {4, 2, 5, 2, 2, 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "L " << c.L << " pp " << c.pp << " m " << c.m << " " << c.f
                                    << ":" << c.b << ":" << c.w);
    const SplitCosts cost(c.f, c.b, c.w);
    const double layers = static_cast<double>(c.L) / c.pp;
    const double F = c.f * layers, B = c.b * layers, W = c.w * layers;
    absl::StatusOr<SimResult> h1 =
        simulate(layout(c.L, c.pp, c.m, actors::ScheduleKind::kZbH1), cost, false);
    ASSERT_TRUE(h1.ok()) << h1.status();
    EXPECT_NEAR(h1->step_s, c.m * (F + B + W) + (c.pp - 1) * (F + B - W), 1e-9);
    EXPECT_NEAR(h1->bubble, 1 - c.m * (F + B + W) / h1->pipeline_s, 1e-12);
    absl::StatusOr<SimResult> z =
        simulate(layout(c.L, c.pp, c.m, actors::ScheduleKind::kZbAuto), cost, false);
    ASSERT_TRUE(z.ok()) << z.status();
    EXPECT_LE(z->step_s, h1->step_s + 1e-9);
  }
  // ZB-V: 2pp chunks of L / 2pp layers, F = B = W.
  for (const auto& [L, pp, m] : std::vector<std::tuple<int, int, int>>{{8, 4, 8}, {16, 8, 16}}) {
    SCOPED_TRACE(testing::Message() << "zbv L " << L << " pp " << pp << " m " << m);
    PlanInput in = layout(L, pp, m, actors::ScheduleKind::kZbV);
    ASSERT_TRUE(actors::place_for_schedule(in.parallel.schedule, &in.parallel).ok());
    absl::StatusOr<SimResult> v = simulate(in, SplitCosts(1, 1, 1), false);
    ASSERT_TRUE(v.ok()) << v.status();
    const double op = static_cast<double>(L) / (2 * pp);  // one chunk's F, B or W
    EXPECT_NEAR(v->step_s, (6 * m + pp - 1) * op, 1e-9);
    // zb-auto on the same V reaches the same least step.
    PlanInput a = layout(L, pp, m, actors::ScheduleKind::kZbAuto, 2);
    ASSERT_TRUE(actors::place_for_schedule(a.parallel.schedule, &a.parallel).ok());
    ASSERT_TRUE(a.parallel.v_shape);
    absl::StatusOr<SimResult> z = simulate(a, SplitCosts(1, 1, 1), false);
    ASSERT_TRUE(z.ok()) << z.status();
    EXPECT_NEAR(z->step_s, (6 * m + pp - 1) * op, 1e-9);
  }
}

// A message's flight is waited for where the schedule has no slack: with
// one micro-batch on p stages the step is p forwards, p backwards and
// 2(p - 1) hops, all exposed.
TEST(PlanSim, HopsOnTheCriticalPathAreExposed) {
  const PlanInput in = layout(4, 4, 1, actors::ScheduleKind::k1F1B);
  absl::StatusOr<SimResult> r = simulate(in, FixedCosts(1.0, 2.0, 0.25), true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->step_s, 4 * 1.0 + 4 * 2.0 + 6 * 0.25, 1e-12);
  EXPECT_EQ(r->ops.size(), 8u);
  EXPECT_EQ(r->messages.size(), 6u);
}

// The DP reduction of each bucket starts when the last backward makes it
// final and queues on the stage's link; the optimizer then steps and the
// parameters come back. By hand: L = 2, one micro-batch, forward [0, 2],
// backward [2, 6]; buckets final at 4 and 6, reduced in 3 s each: [4, 7],
// [7, 10]; AdamW 1 s, parameters back in 0.5 s: the step ends at 11.5, of
// which 4 + 0.5 is DP time past the last op.
class BucketCosts final : public Costs {
 public:
  ChunkCost chunk(const model::StageSpec& spec) const override {
    ChunkCost c;
    c.fwd = 1.0 * spec.layers();
    c.bwd = 2.0 * spec.layers();
    for (int l = 0; l < spec.layers(); l++) c.buckets.push_back({2.0 * (l + 1), 100});
    c.owned_elements = 10;
    return c;
  }
  double p2p_seconds(int, int) const override { return 0; }
  double dp_reduce_seconds(int, double bytes) const override { return bytes == 100 ? 3 : -1; }
  double dp_gather_seconds(int, double) const override { return 0.5; }
  double optimizer_seconds(double elements) const override {
    return elements / 5;
  }  // 1 s a chunk's partition
};

TEST(PlanSim, TheDataParallelReductionOverlapsAndEndsTheStep) {
  PlanInput in = layout(2, 1, 2, actors::ScheduleKind::k1F1B);
  in.parallel.dp = 2;  // each replica one micro-batch; partitions of 10 / 2
  absl::StatusOr<SimResult> r = simulate(in, BucketCosts(), false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->pipeline_s, 6);
  EXPECT_DOUBLE_EQ(r->step_s, 11.5);
  EXPECT_DOUBLE_EQ(r->dp_exposed_s, 4.5);
  EXPECT_DOUBLE_EQ(r->optimizer_s, 1);
  // Without the overlap (Megatron before --overlap-grad-reduce): both buckets
  // after the last op, [6, 9] and [9, 12]; the step ends at 13.5.
  in.overlap_grad_reduce = false;
  r = simulate(in, BucketCosts(), false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->pipeline_s, 6);
  EXPECT_DOUBLE_EQ(r->step_s, 13.5);
  EXPECT_DOUBLE_EQ(r->dp_exposed_s, 6.5);
  // On other schedules: the pipeline, then each stage's buckets one after
  // another (a stage of L / pp = 4 layers has 4 buckets of 3 s), AdamW (1 s
  // a chunk's partition: two chunks a stage interleaved, one in ZB-H1) and
  // the gather (0.5 s).
  for (const auto& [kind, v] : {std::pair{actors::ScheduleKind::kInterleaved1F1B, 2},
                                std::pair{actors::ScheduleKind::kZbH1, 1}}) {
    PlanInput p = layout(8, 2, 4, kind, v);
    p.parallel.dp = 2;
    p.overlap_grad_reduce = false;
    ASSERT_TRUE(actors::place_for_schedule(kind, &p.parallel).ok());
    absl::StatusOr<SimResult> q = simulate(p, BucketCosts(), false);
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_DOUBLE_EQ(q->step_s, q->pipeline_s + 4 * 3 + v + 0.5) << actors::schedule_name(kind);
  }
}

// NCCL's all-reduce on the 8 GPUs of a node: ring 2(p-1) alpha + 2(p-1)/p
// n/B, or the tree, which inside one node is a chain: 2(p-1) alpha + 2n/B,
// never faster; by hand for A100's NVLink (300 GB/s each way, of which NCCL
// moves 73%; 5 us).
TEST(PlanCost, TensorParallelAllReduceIsNcclsRing) {
  const Cluster c = selene();
  PlanInput in = layout(4, 1, 1, actors::ScheduleKind::k1F1B);
  in.parallel.tp = 8;
  in.model.NH = 8;
  absl::StatusOr<Device> d = c.device(8, Precision::kBf16);
  ASSERT_TRUE(d.ok());
  CostModel cost(in, c, *d);
  for (double n : {1e3, 1e9}) {
    EXPECT_NEAR(cost.tp_all_reduce_seconds(n), 14 * 5e-6 + 2 * 7.0 / 8 * n / (0.73 * 300e9),
                1e-15 + 1e-12 * n)
        << n;
  }
}

// A DP group across nodes: NCCL's rings run through every NIC, so a node
// with k of the group's members gives it k GPUs' shares of its NICs (25
// GB/s each on Selene), up to NCCL's NVLink rate (0.73 x 300 GB/s on
// Selene, 0.82 x 450 on H100), the ring at the pace of the node with the
// fewest. By hand, the reduce-scatter's (p-1) alpha + (p-1)/p n/B.
TEST(PlanCost, ADataParallelGroupAcrossNodesUsesItsMembersNics) {
  const Cluster c = selene();
  absl::StatusOr<Device> d = c.device(8, Precision::kBf16);
  ASSERT_TRUE(d.ok());
  const double n = 1e9;
  auto reduce = [&](const Cluster& cl, const Device& dev, int tp, int dp, int pp, int stage) {
    PlanInput in = layout(4 * pp, pp, dp, actors::ScheduleKind::k1F1B);
    in.parallel.tp = tp;
    in.parallel.dp = dp;
    in.model.NH = 8;
    return CostModel(in, cl, dev).dp_reduce_seconds(stage, n);
  };
  // 16 replicas: tp 1 on 2 nodes (8 a node), tp 2 on 4 (4 a node), tp 8 on 16 (1).
  for (const auto& [tp, bw] :
       {std::pair{1, 8 * 25e9}, std::pair{2, 4 * 25e9}, std::pair{8, 25e9}}) {
    EXPECT_NEAR(reduce(c, *d, tp, 16, 1, 0), 15 * 8e-6 + 15.0 / 16 * n / bw, 1e-12) << "tp " << tp;
  }
  // 12 replicas of tp 1: 8 on one node, 4 on the next; the ring goes at 4's pace.
  EXPECT_NEAR(reduce(c, *d, 1, 12, 1, 0), 11 * 8e-6 + 11.0 / 12 * n / (4 * 25e9), 1e-12);
  // Inside one node: NVLink.
  EXPECT_NEAR(reduce(c, *d, 1, 8, 1, 0), 7 * 5e-6 + 7.0 / 8 * n / (0.73 * 300e9), 1e-12);
  // Each stage its own group: tp 2, dp 3, pp 2 puts stage 0's ranks 0, 2, 4 on
  // node 0 and stage 1's 6, 8, 10 across nodes 0 and 1 (2 and 1 members).
  EXPECT_NEAR(reduce(c, *d, 2, 3, 2, 0), 2 * 5e-6 + 2.0 / 3 * n / (0.73 * 300e9), 1e-12);
  EXPECT_NEAR(reduce(c, *d, 2, 3, 2, 1), 2 * 8e-6 + 2.0 / 3 * n / 25e9, 1e-12);
  // H100: 8 members' shares (8 x 50 GB/s) pass NCCL's NVLink rate, which caps them.
  absl::StatusOr<Cluster> h = load_cluster("dgx-h100");
  ASSERT_TRUE(h.ok());
  absl::StatusOr<Device> hd = h->device(8, Precision::kBf16);
  ASSERT_TRUE(hd.ok());
  EXPECT_NEAR(reduce(*h, *hd, 1, 16, 1, 0), 15 * 7e-6 + 15.0 / 16 * n / (0.82 * 450e9), 1e-12);
}

// A chunk's compute on a cluster whose GEMMs run at their peak whatever the
// shape (no launch cost, no partial waves) and whose memory is free: the forward is the FLOPs
// counted by hand from GPT-2's matrices (per layer 2BT(3C^2 + C^2 + 4C^2 + 4C^2) for qkv,
// projection, fc, fc-proj, and 4 B NH T^2 HS for q.k and att.v), the LM
// head's 2BTVpC; the backward twice that; full recompute adds the layers'
// forward to the backward, selective the attention core's.
TEST(PlanCost, ChunkComputeIsTheModelsFlops) {
  absl::StatusOr<Cluster> c = selene_with(
      {
          {"gemm_max", "1"},
          {"gemm_half_m", "0"},
          {"gemm_half_n", "0"},
          {"gemm_half_k", "0"},
          {"gemm_launch_us", "0"},
          {"sms", "100000"},  // every GEMM here under one wave
          {"memory_gbytes_per_s", "1e7"},
      },
      "flat.json");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Device> d = c->device(1, Precision::kBf16);
  ASSERT_TRUE(d.ok());
  PlanInput in;
  in.model = *model::preset("gpt2-124m");  // L=12 C=768 NH=12 T=1024, Vp 50304
  in.micro_batch = 2;
  in.global_batch = 2;
  const double B = 2, T = 1024, C = 768, NH = 12, HS = 64, Vp = 50304, L = 12, peak = 312e12;
  const double layer = 2 * B * T * 12 * C * C + 4 * B * NH * T * T * HS;
  const double head = 2 * B * T * Vp * C;
  const model::StageSpec whole = model::StageSpec::whole(in.model);
  CostModel none(in, *c, *d);
  const ChunkCost k = none.chunk(whole);
  EXPECT_NEAR(k.fwd / ((L * layer + head) / peak), 1, 1e-3);
  EXPECT_NEAR(k.bwd / (2 * (L * layer + head) / peak), 1, 1e-3);
  in.recompute = actors::Recompute::kFull;
  EXPECT_NEAR(CostModel(in, *c, *d).chunk(whole).bwd - k.bwd, L * layer / peak, 1e-3 * k.bwd);
  // Selective recompute: the reference kernel's scores again; flash keeps
  // them all, so nothing.
  in.recompute = actors::Recompute::kSelective;
  EXPECT_EQ(CostModel(in, *c, *d).chunk(whole).bwd, k.bwd);
  in.attention = model::AttentionKernel::kReference;
  EXPECT_NEAR(CostModel(in, *c, *d).chunk(whole).bwd - k.bwd, L * 4 * B * NH * T * T * HS / peak,
              1e-3 * k.bwd);
  in.attention = model::AttentionKernel::kFlash;
  // Buckets: the head's (ln_f) first, each layer's at the end of its
  // backward, wte and wpe last, at the backward's end; the bytes are every
  // parameter once, fp32.
  ASSERT_EQ(k.buckets.size(), 15u);  // ln_f, 12 layers, wte, wpe
  EXPECT_NEAR(k.buckets.back().at, k.bwd, 1e-12);
  const double layer_bwd = 2 * layer / peak;
  EXPECT_NEAR(k.buckets[2].at - k.buckets[1].at, layer_bwd, 1e-3 * layer_bwd);
  double bytes = 0;
  for (const ChunkCost::Bucket& b : k.buckets) bytes += b.bytes;
  EXPECT_NEAR(bytes, 4.0 * model::ParamLayout::gpt(in.model, whole, {}).total(), 1);
}

// Every kernel pays the file's fixed cost: on a cluster where compute and
// memory are free, a chunk's time is its kernels counted by hand times it.
// Per layer forward: LayerNorm 2, qkv / projection / fc / fc-proj GEMMs 4,
// attention's two batched GEMMs and its softmax 3, GELU 1, residual adds 2 =
// 12; the embedding 1; the head's LayerNorm, GEMM and cross-entropy 3.
// Backward: LayerNorm 2, each linear GEMM two (input and weight gradients)
// 8, attention's 4 and its softmax 1, GELU 1, the residual stream's two adds
// = 18; the head's fill, cross-entropy, two GEMMs and LayerNorm 5; the
// embedding's 1.
TEST(PlanCost, EveryKernelPaysItsFixedCost) {
  absl::StatusOr<Cluster> c = selene_with(
      {
          {"bf16", "1e6"},
          {"memory_gbytes_per_s", "1e7"},
          {"gemm_launch_us", "5"},
      },
      "fixed.json");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Device> d = c->device(1, Precision::kBf16);
  ASSERT_TRUE(d.ok());
  PlanInput in;
  in.model = *model::preset("gpt2-124m");  // L = 12
  in.micro_batch = 1;
  in.global_batch = 1;
  in.attention = model::AttentionKernel::kReference;
  const ChunkCost k = CostModel(in, *c, *d).chunk(model::StageSpec::whole(in.model));
  // (Within 2 us: the GEMMs and the bytes cost a little still; a kernel more
  // or less is 5.)
  EXPECT_NEAR(k.fwd, (12 * 12 + 1 + 3) * 5e-6, 2e-6);
  EXPECT_NEAR(k.bwd, (12 * 18 + 5 + 1) * 5e-6, 2e-6);
}

// --dropout: Megatron's masks, by the bytes they move at the file's memory
// rate (GEMMs free): per layer forward a byte written for each of the
// reference core's B NH T^2 probabilities, which are also read and written
// (2 bf16 bytes each way), and one for each of the two residual branches' B T C;
// backward the gradient read and written with the mask, on both. Flash fuses
// the attention's; full recompute runs the forward's again.
TEST(PlanCost, DropoutIsItsMasksTraffic) {
  absl::StatusOr<Cluster> c = selene_with(
      {
          {"bf16", "1e6"},  // the peak: GEMMs all but free (the differences cancel them anyway)
          {"gemm_launch_us", "0"},
          {"memory_gbytes_per_s", "1000"},
      },
      "dropout.json");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Device> d = c->device(1, Precision::kBf16);
  ASSERT_TRUE(d.ok());
  const double rate = 1000e9 * 0.8;  // the file's memory efficiency
  PlanInput in;
  in.model = *model::preset("gpt2-124m");  // L=12 C=768 NH=12 T=1024
  in.micro_batch = 2;
  in.global_batch = 2;
  in.attention = model::AttentionKernel::kReference;
  const double B = 2, T = 1024, C = 768, NH = 12, L = 12;
  const double scores = B * NH * T * T, rows = B * T * C;
  const model::StageSpec whole = model::StageSpec::whole(in.model);
  const ChunkCost off = CostModel(in, *c, *d).chunk(whole);
  in.dropout = 0.1;
  const ChunkCost on = CostModel(in, *c, *d).chunk(whole);
  EXPECT_NEAR(on.fwd - off.fwd, L * (5 * scores + 2 * rows) / rate, 1e-9);
  EXPECT_NEAR(on.bwd - off.bwd, L * (5 * scores + 2 * 5 * rows) / rate, 1e-9);
  in.attention = model::AttentionKernel::kFlash;
  const ChunkCost flash = CostModel(in, *c, *d).chunk(whole);
  in.dropout = 0;
  const ChunkCost flash_off = CostModel(in, *c, *d).chunk(whole);
  EXPECT_NEAR(flash.fwd - flash_off.fwd, L * 2 * rows / rate, 1e-9);
  in.recompute = actors::Recompute::kFull;
  const double full_off = CostModel(in, *c, *d).chunk(whole).bwd;
  in.dropout = 0.1;
  EXPECT_NEAR(CostModel(in, *c, *d).chunk(whole).bwd - full_off,
              L * (2 * 5 * rows + 2 * rows) / rate, 1e-9);
  // tp 2 with sequence parallelism: a rank holds half the heads' probabilities
  // and half the rows of each residual branch. (The cost is the masks' traffic
  // whatever the probability: --dropout is a switch.)
  in.recompute = actors::Recompute::kNone;
  in.attention = model::AttentionKernel::kReference;
  in.parallel.tp = 2;
  in.sequence_parallel = true;
  const ChunkCost sp_on = CostModel(in, *c, *d).chunk(whole);
  in.dropout = 0;
  const ChunkCost sp_off = CostModel(in, *c, *d).chunk(whole);
  EXPECT_NEAR(sp_on.fwd - sp_off.fwd, L * (5 * scores / 2 + 2 * rows / 2) / rate, 1e-9);
  EXPECT_NEAR(sp_on.bwd - sp_off.bwd, L * (5 * scores / 2 + 2 * 5 * rows / 2) / rate, 1e-9);
}

// The JSON carries the fields the issue names; 530B on Selene at 2,240
// GPUs with full recompute fits (Megatron trained it so).
TEST(PlanReport, MtNlgOnSeleneFitsAndReportsEveryField) {
  const Cluster c = selene();
  PlanInput in;
  in.model = *model::preset("mt-nlg-530b");
  in.parallel.tp = 8;
  in.parallel.pp = 35;
  in.parallel.dp = 8;
  in.micro_batch = 1;
  in.global_batch = 1920;
  in.recompute = actors::Recompute::kFull;
  absl::StatusOr<Plan> p = make_plan(in, c, actors::MemoryMode::kPaper, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->fits);
  const nlohmann::json j = plan_json(*p);
  for (const char* k : {"step_s", "tokens_per_s", "tflops_per_gpu", "bubble", "exposed_comm_s",
                        "memory_gib_per_gpu", "fits"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  for (const char* k : {"params_gib", "grads_gib", "optimizer_gib", "activations_gib"}) {
    EXPECT_TRUE(j["memory"].contains(k)) << k;
  }
  // Without recompute the activations of 35 in-flight micro-batches do not
  // fit with the attention scores kept (MT-NLG's 2021 run, before flash
  // attention); with flash attention (no 5as/h term) they do.
  in.recompute = actors::Recompute::kNone;
  in.attention = model::AttentionKernel::kReference;
  p = make_plan(in, c, actors::MemoryMode::kPaper, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fits);
  in.attention = model::AttentionKernel::kFlash;
  p = make_plan(in, c, actors::MemoryMode::kPaper, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->fits);
  // tp 16 leaves the node.
  in.parallel.tp = 16;
  in.parallel.dp = 4;
  EXPECT_EQ(make_plan(in, c, actors::MemoryMode::kPaper, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Megatron's model FLOPs by hand for a small case.
TEST(PlanReport, ModelFlopsAreMegatronsFormula) {
  model::GptConfig c = *model::preset("tiny");  // L=4 C=64 T=64 V=512 (Vp 512)
  const double B = 8, s = 64, l = 4, h = 64, V = 512;
  EXPECT_DOUBLE_EQ(model_flops(c, 8, false),
                   72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)));
  EXPECT_DOUBLE_EQ(model_flops(c, 8, true),
                   96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)));
}

// Against published measurements: Narayanan et al. 2021 (Megatron-LM on
// Selene's A100s), Table 1, with their 96·B·s·l·h² formula and full
// recompute: 145.6B (96 heads, hidden 12288, 80 layers) at tp 8, pp 8,
// 1536 GPUs, batch 2304: 148 TFLOP/s per GPU; 310.1B (128 heads, 16384,
// 96 layers) at tp 8, pp 16, 1920 GPUs, batch 2160: 155. (Their 530B and 1T
// rows are left to the planner issue's validation table.) The cluster
// file's efficiencies were not fitted to these; the planner comes within
// 15% (it predicts 10% more: no kernel launch gaps, no NCCL kernels
// competing for the SMs, the p2p messages whole).
TEST(PlanReport, MegatronsMeasuredThroughputIsWithin15Percent) {
  struct Row {
    int heads, hidden, layers, pp, gpus, batch;
    double tflops;
  };
  for (const Row& r :
       {Row{96, 12288, 80, 8, 1536, 2304, 148}, Row{128, 16384, 96, 16, 1920, 2160, 155}}) {
    PlanInput in;
    in.model = *model::preset("gpt3-175b");
    in.model.NH = r.heads;
    in.model.C = r.hidden;
    in.model.L = r.layers;
    in.parallel.tp = 8;
    in.parallel.pp = r.pp;
    in.parallel.dp = r.gpus / (8 * r.pp);
    in.micro_batch = 1;
    in.global_batch = r.batch;
    in.recompute = actors::Recompute::kFull;
    absl::StatusOr<Plan> p = make_plan(in, selene(), actors::MemoryMode::kPaper, false);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NEAR(p->tflops_per_gpu / r.tflops, 1, 0.15) << r.hidden << ": " << p->tflops_per_gpu;
    EXPECT_TRUE(p->fits) << r.hidden;
  }
}

// this-machine with more ranks than cores: the ranks take turns, so one
// stage's bubble is another's compute. pp 4 of 8 micro-batches on 2 cores:
// each rank computes at its speed alone on a core (the 4-core machine's
// plan, same threads per rank), and the pipeline is every rank's compute
// over the cores, 4 x 8 (F + B) / 2 = 16 (F + B), not the 1F1B schedule's
// (8 + 3)(F + B) slowed by 4/2 for its whole length (22 (F + B): the
// planner's model before, 62% over a measured tp 2 x pp 2 on 2 cores).
TEST(PlanReport, RanksBeyondTheCoresTakeTurnsOnThem) {
  Cluster c;
  c.name = "this-machine";
  c.calibrated = true;
  c.memory_gib = 64;
  Compute k;
  k.gemm_fwd = k.gemm_bwd = GemmCurve{.peak_flops = 1e11, .m0 = 16, .n0 = 16, .k0 = 16};
  k.fused_attention = true;
  k.attention_fwd_flops = k.attention_bwd_flops = 1e10;
  k.reference_attention_fwd_flops = k.reference_attention_bwd_flops = 1e10;
  k.memory_bytes_per_s = 1e10;
  c.by_threads[1] = k;
  c.inproc = c.ucx = Link{.latency_s = 0, .bytes_per_s = 1e12};
  PlanInput in = layout(8, 4, 8, actors::ScheduleKind::k1F1B);
  in.precision = Precision::kFp32;
  c.cores = 4;
  absl::StatusOr<Plan> alone = make_plan(in, c, actors::MemoryMode::kCounted, false);
  c.cores = 2;
  absl::StatusOr<Plan> shared = make_plan(in, c, actors::MemoryMode::kCounted, false);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE(shared.ok()) << shared.status();
  const SimResult& a = alone->sim;
  ASSERT_EQ(a.busy_s.size(), 4u);
  const SimResult::ChunkTimes& stage = a.chunks[1][0];  // a middle stage: two layers
  const double fb = stage.fwd_s + stage.bwd_s;
  EXPECT_NEAR(a.busy_s[1], 8 * fb, 1e-9 * fb);
  EXPECT_EQ(shared->sim.busy_s, a.busy_s);  // the same speed alone on a core
  double busy = 0;
  for (double b : a.busy_s) busy += b;
  EXPECT_NEAR(shared->sim.pipeline_s, busy / 4 * 2, 1e-9 * busy);
  EXPECT_GT(shared->sim.pipeline_s, a.pipeline_s);
  EXPECT_LT(shared->sim.pipeline_s, 2 * a.pipeline_s);  // the old model's
  // The optimizer, every rank's at once, is slowed by the share (4 / 2);
  // the cores are never idle in the pipeline.
  EXPECT_NEAR(shared->sim.optimizer_s, 2 * a.optimizer_s, 1e-9 * a.optimizer_s);
  EXPECT_GT(a.optimizer_s, 0);
  EXPECT_EQ(shared->sim.bubble, 0);
  EXPECT_GT(a.bubble, 0.2);
}

}  // namespace
}  // namespace troupe::launcher::plan
