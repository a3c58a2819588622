// The planner's hardware: cluster files (their figures, errors and sources),
// the GEMM curve (a kernel's fixed cost, the last wave's quantisation, the
// backward's transposed GEMMs) and calibrate's fit of it.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "launcher/plan/calibrate.h"
#include "launcher/plan/clusters.h"
#include "launcher/plan/hardware.h"
#include "tests/plan/selene.h"

namespace troupe::launcher::plan {
namespace {

// A GPU's share of its node's NICs, and the GEMM curve at a hand point:
// 2048 x 4096 in 128 x 128 tiles is 512 tiles, 5 waves of A100's 108 SMs
// (540 tiles' time; 256 x 128 tiles would take 3 waves of 108 for 256).
TEST(PlanCost, ClusterFiguresComeFromTheFile) {
  const Cluster c = selene();
  EXPECT_EQ(c.max_gpus(), 4480);
  EXPECT_DOUBLE_EQ(c.inter.bytes_per_s, 25e9);  // 8 HDR NICs of 25 GB/s for 8 GPUs
  absl::StatusOr<Device> d = c.device(8, Precision::kBf16);
  ASSERT_TRUE(d.ok());
  EXPECT_DOUBLE_EQ(d->peak_flops, 312e12);
  // 5.63 us + 0.813 x 312 TFLOP/s x (2048/2140)(4096/4188)(4096/4152), x 540/512
  const double eff = 0.813 * 2048.0 / 2140 * 4096.0 / 4188 * 4096.0 / 4152;
  EXPECT_NEAR(d->compute.gemm_seconds(2048, 4096, 4096, GemmPass::kForward),
              5.63e-6 + 2.0 * 2048 * 4096 * 4096 / (312e12 * eff) * 540 / 512, 1e-12);
  EXPECT_DOUBLE_EQ(d->intra.bytes_per_s, 0.73 * 300e9);  // NCCL's share of NVLink
}

// The last wave's quantisation (NVIDIA's matrix-multiplication guide,
// section 3), by hand on 108 SMs with 256 x 128 tiles: whole waves over
// the tiles.
TEST(PlanCost, ALastWavePartlyEmptyIsPaidInFull) {
  const GemmCurve g{.peak_flops = 1, .sms = 108};
  // 2048 x 2304: 144 tiles of 256 x 128 either way round (2 waves: 216
  // tiles' time), 288 of 128 x 128 (3 waves: 324): 324 x 128^2 / (2048 x 2304).
  EXPECT_DOUBLE_EQ(g.wave_quantisation(2048, 2304), 324.0 / 288);
  // 6912 x 512: 27 x 4 = 108 tiles, one full wave.
  EXPECT_DOUBLE_EQ(g.wave_quantisation(6912, 512), 1);
  // Under one wave cuBLAS takes smaller tiles or splits K: the curve covers it.
  EXPECT_DOUBLE_EQ(g.wave_quantisation(1024, 1024), 1);
  // A ragged edge counts whole tiles, its padding left to the curve: 2000 x
  // 4096 is 8 x 32 = 256 tiles of 256 x 128 (3 waves, 324), 16 x 16 of 128 x
  // 256 (the same), 16 x 32 = 512 of 128 x 128 (5 waves, 540).
  EXPECT_DOUBLE_EQ(g.wave_quantisation(2000, 4096), 540.0 / 512);
  // A head size of 96 is one 128-wide tile, not a penalty of 128/96.
  EXPECT_DOUBLE_EQ(g.wave_quantisation(2048, 96, 32), g.wave_quantisation(2048, 128, 32));
  EXPECT_DOUBLE_EQ(GemmCurve{}.wave_quantisation(2000, 4096), 1);  // no SMs given: none
  // The step at one wave (kept: the published runs' cuBLAS has no stream-K): on
  // 132 SMs 131 tiles of 256 x 128 are under a wave; 133 are 266 squares of 128
  // in 3 waves (396 squares' time), better than 2 waves of 132 big tiles.
  const GemmCurve h{.peak_flops = 1, .sms = 132};
  EXPECT_DOUBLE_EQ(h.wave_quantisation(131 * 256, 128), 1);
  EXPECT_DOUBLE_EQ(h.wave_quantisation(133 * 256, 128), 396.0 / 266);
  // A batched kernel quantises its tiles together: 32 heads of 2048 x 2048 are
  // 32 x 128 = 4096 tiles, 38 waves of 108 (4104 tiles' time); one head alone
  // is 128 tiles in 2 waves (216 tiles' time) or 256 squares in 3 (324).
  EXPECT_DOUBLE_EQ(g.wave_quantisation(2048, 2048, 32), 4104.0 / 4096);
  EXPECT_DOUBLE_EQ(g.wave_quantisation(2048, 2048), 324.0 / 256);
  // Tiles given the other way round: the square is still the smaller side.
  const GemmCurve t{.peak_flops = 1, .sms = 108, .tile_m = 128, .tile_n = 256};
  EXPECT_DOUBLE_EQ(t.wave_quantisation(2048, 2304), g.wave_quantisation(2048, 2304));
}

// The backward as cuBLAS runs it on a GPU: the input gradient (M x K, over N)
// and the weight gradient (K x N, over M), each on the curve with its own
// shape; by hand for a curve whose half sizes differ (m0 64, n0 128, k0 256)
// and a lopsided GEMM (M 4096, N 384, K 1536), one launch each.
TEST(PlanCost, TheBackwardIsTheTwoTransposedGemms) {
  Compute k;
  k.gemm_fwd = GemmCurve{.peak_flops = 1e14, .m0 = 64, .n0 = 128, .k0 = 256, .launch_s = 1e-5};
  k.gemm_bwd = k.gemm_fwd;
  k.transposed_backward = true;
  const double M = 4096, N = 384, K = 1536;
  auto t = [](double a, double b, double c) {
    return 1e-5 + 2 * a * b * c / (1e14 * a / (a + 64) * b / (b + 128) * c / (c + 256));
  };
  EXPECT_DOUBLE_EQ(k.gemm_seconds(M, N, K, GemmPass::kForward), t(M, N, K));
  EXPECT_NEAR(k.gemm_seconds(M, N, K, GemmPass::kBackward), t(M, K, N) + t(K, N, M), 1e-15);
  EXPECT_NEAR(k.weight_grad_seconds(M, N, K), t(K, N, M), 1e-15);
  // Batched: one launch for all of them.
  EXPECT_NEAR(k.gemm_seconds(M, N, K, GemmPass::kForward, 8), t(M, N, K) * 8 - 7e-5, 1e-15);
}

TEST(PlanCalibrate, FitRecoversAKnownCurve) {
  const GemmCurve want{.peak_flops = 1e11, .m0 = 32, .n0 = 64, .k0 = 128};
  std::vector<GemmPoint> points;
  for (double M : {256.0, 1024.0, 4096.0}) {
    for (double N : {64.0, 256.0, 2048.0}) {
      for (double K : {32.0, 512.0, 4096.0}) points.push_back({M, N, K, want.seconds(M, N, K)});
    }
  }
  const GemmFit fit = fit_gemm_curve(points, 2);
  EXPECT_NEAR(fit.peak_flops, 1e11, 1e5);
  EXPECT_DOUBLE_EQ(fit.m0, 32);
  EXPECT_DOUBLE_EQ(fit.n0, 64);
  EXPECT_DOUBLE_EQ(fit.k0, 128);
  EXPECT_LT(fit.rms_log_error, 1e-9);
}

TEST(PlanClusters, BadFilesNameTheFileAndTheField) {
  absl::StatusOr<Cluster> c = parse_cluster("{\"name\": \"x\"}", "x.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("x.json: missing field 'description'"), std::string::npos)
      << c.status();
  c = parse_cluster("[1,", "y.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("y.json: not a JSON object"), std::string::npos);
  std::string text = builtin_clusters()[0].json;
  const std::string key = "\"memory_gbytes_per_s\": 2039";
  text.replace(text.find(key), key.size(), "\"memory_gbytes_per_s\": -5");
  c = parse_cluster(text, "z.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("z.json: field 'gpu.memory_gbytes_per_s' is -5"),
            std::string::npos)
      << c.status();
  for (const auto& [field, bad] :
       {std::pair{"\"sms\": 108", "\"sms\": 0"},
        std::pair{"\"achieved_fraction\": 0.73", "\"achieved_fraction\": 2"},
        std::pair{"\"gemm_launch_us\": 5.63", "\"gemm_launch_us\": -1"}}) {
    std::string t = builtin_clusters()[0].json;
    ASSERT_NE(t.find(field), std::string::npos) << field;
    t.replace(t.find(field), std::string(field).size(), bad);
    c = parse_cluster(t, "w.json");
    ASSERT_FALSE(c.ok()) << bad;
    const std::string name = std::string(field).substr(1, std::string(field).find('"', 1) - 1);
    EXPECT_NE(c.status().message().find("w.json: field '"), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find(name + "' "), std::string::npos) << c.status();
  }
  // A misspelt optional field is an error, not a silent default.
  text = builtin_clusters()[0].json;
  text.replace(text.find("\"gemm_launch_us\""), 16, "\"gemm_lanch_us\"");
  c = parse_cluster(text, "v.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("v.json: unknown field 'efficiency.gemm_lanch_us'"),
            std::string::npos)
      << c.status();
  c = load_cluster("dgx-z100");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("known: dgx-a100-80gb-selene"), std::string::npos);
}

TEST(PlanClusters, EveryBuiltInClusterParsesAndCitesItsSources) {
  for (const BuiltinCluster& b : builtin_clusters()) {
    absl::StatusOr<Cluster> c = parse_cluster(b.json, b.name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->name, b.name);
    EXPECT_GE(c->sources.size(), 2u) << b.name;
    EXPECT_FALSE(c->assumptions.empty()) << b.name;
  }
}

}  // namespace
}  // namespace troupe::launcher::plan
