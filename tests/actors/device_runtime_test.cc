// The actors' runtime on a device whose memory the host cannot read
// (gpu::make_opaque_cpu_device: the CPU's kernels under a GPU's rule, where
// a host read of device memory throws) trains bitwise as on the CPU device:
// activations, gradients, parameters, losses and norms reach the host
// through host mirrors and copies on the streams, checkpoints through host
// copies of the state, and TP's collectives are device calls on the
// device's own memory (as NCCL's are on a GPU).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "actors/rank/rank.h"
#include "actors/runtime/in_process.h"
#include "comm/inproc_transport.h"
#include "gpu/device.h"
#include "model/checkpoint.h"
#include "tests/actors/runtime_fixtures.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using gpu::Precision;

using fixtures::Trained;

// tiny (4 layers) for 4 steps, evaluated every 2; fp16 from a scale that
// overflows.
model::TrainOptions device_tiny4(Precision p) {
  model::TrainOptions o = fixtures::tiny({.layers = 4,
                                          .micro_batch = 2,
                                          .global_batch = 8,
                                          .steps = 4,
                                          .warmup_iters = 1,
                                          .decay_iters = 4,
                                          .eval_interval = 2,
                                          .eval_iters = 1,
                                          .activations = fixtures::in_precision(p)});
  if (p == Precision::kFp16) {
    o.loss_scale.initial = 0x1p32f;  // the skip path runs
    o.loss_scale.hysteresis = 1;
  }
  return o;
}

Trained train(const model::TrainOptions& o, const ParallelOptions& par, gpu::Device* device,
              const RunCheckpoints& ck = {}) {
  return fixtures::train_layout(o, par, device, ck);
}

void expect_same(const model::StepMetrics& a, const model::StepMetrics& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.loss, b.loss) << "step " << a.step;
  EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << a.step;
  EXPECT_EQ(a.lr, b.lr) << "step " << a.step;
  EXPECT_EQ(a.loss_scale, b.loss_scale) << "step " << a.step;
  EXPECT_EQ(a.skipped, b.skipped) << "step " << a.step;
  EXPECT_EQ(a.val_loss.has_value(), b.val_loss.has_value()) << "step " << a.step;
  if (a.val_loss && b.val_loss) {
    EXPECT_EQ(*a.val_loss, *b.val_loss) << "step " << a.step;
  }
}

void expect_same(const Trained& want, const Trained& got) {
  ASSERT_EQ(got.metrics.size(), want.metrics.size());
  for (std::size_t i = 0; i < want.metrics.size(); i++)
    expect_same(want.metrics[i], got.metrics[i]);
  ASSERT_EQ(got.params.size(), want.params.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < want.params.size(); i++) differ += got.params[i] != want.params[i];
  EXPECT_EQ(differ, 0u) << "of " << want.params.size() << " parameters";
}

struct Case {
  const char* name;
  Precision precision;
  ParallelOptions parallel;
  bool sequence_parallel = false;
  model::RampUp rampup = {};
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DeviceRuntime : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { opaque_ = gpu::make_opaque_cpu_device(); }
  std::unique_ptr<gpu::Device> opaque_;
};

TEST_P(DeviceRuntime, OpaqueDeviceTrainsBitwiseAsTheCpu) {
  const Case& c = GetParam();
  model::TrainOptions o = device_tiny4(c.precision);
  o.activations.sequence_parallel = c.sequence_parallel;
  o.rampup = c.rampup;
  const Trained want = train(o, c.parallel, nullptr);
  const std::int64_t before = opaque_->allocated_bytes();
  const Trained got = train(o, c.parallel, opaque_.get());  // (it checks the device was used)
  expect_same(want, got);
  int skipped = 0, evaluated = 0;
  for (const model::StepMetrics& m : want.metrics) {
    skipped += m.skipped ? 1 : 0;
    evaluated += m.val_loss ? 1 : 0;
  }
  EXPECT_EQ(evaluated, 2);
  if (c.rampup.enabled()) {
    EXPECT_LT(want.metrics.front().global_batch, want.metrics.back().global_batch);
  }
  if (c.precision == Precision::kFp16) {
    EXPECT_GT(skipped, 0);  // the skip path ran
  }
  // The ranks' memory was the opaque device's (and all of it is freed).
  EXPECT_EQ(opaque_->allocated_bytes(), before);
}

ParallelOptions interleaved() {
  return {{.pp = 2, .virtual_stages = 2}, ScheduleKind::kInterleaved1F1B};
}

// zbv's V: the last stage's two chunks pass their activation and gradient
// through its link to itself.
ParallelOptions zbv(comm::Layout l) {
  ParallelOptions par{l, ScheduleKind::kZbV};
  EXPECT_TRUE(place_for_schedule(par.schedule, &par).ok());
  return par;
}

// zb-auto on the same V (--virtual-stages 2).
ParallelOptions zb_auto_v(comm::Layout l) {
  l.virtual_stages = 2;
  ParallelOptions par{l, ScheduleKind::kZbAuto};
  EXPECT_TRUE(place_for_schedule(par.schedule, &par).ok());
  return par;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DeviceRuntime,
    ::testing::Values(
        Case{"tp2", Precision::kFp32, {{.tp = 2}}},
        Case{"pp2_dp2", Precision::kFp32, {{.pp = 2, .dp = 2}}},
        Case{"pp2_v2_interleaved", Precision::kFp32, interleaved()},
        Case{"tp2_sequence_parallel", Precision::kFp32, {{.tp = 2}}, true},
        Case{"tp2_pp2_dp2_bf16", Precision::kBf16, {{.tp = 2, .pp = 2, .dp = 2}}},
        Case{"pp2_dp2_fp16", Precision::kFp16, {{.pp = 2, .dp = 2}}},
        Case{"pp2_zbv", Precision::kFp32, zbv({.pp = 2})},
        Case{"tp2_pp2_zbv_bf16", Precision::kBf16, zbv({.tp = 2, .pp = 2})},
        Case{"pp2_dp2_zb_auto", Precision::kFp32, {{.pp = 2, .dp = 2}, ScheduleKind::kZbAuto}},
        Case{"pp2_zb_auto_v", Precision::kFp32, zb_auto_v({.pp = 2})},
        // Steps of 4 sequences, then 8: fewer micro-batches than buffers.
        Case{"pp2_dp2_rampup",
             Precision::kFp32,
             {{.pp = 2, .dp = 2}},
             false,
             {.start = 4, .increment = 4, .samples = 8}}),
    [](const ::testing::TestParamInfo<Case>& p) { return std::string(p.param.name); });

// A checkpoint the opaque device saved (its state copied to the host) and
// loaded (copied back) continues as the run that never stopped did on the
// CPU: the parameters, the bf16 master and Adam's moments all round-trip.
TEST(DeviceRuntimeCheckpoint, SaveAndResumeOnTheOpaqueDevice) {
  std::unique_ptr<gpu::Device> opaque = gpu::make_opaque_cpu_device();
  const model::TrainOptions o = device_tiny4(Precision::kBf16);
  const ParallelOptions par{{.pp = 2, .dp = 2}};
  const Trained straight = train(o, par, nullptr);
  const std::string dir = ::testing::TempDir() + "device_runtime_ckpt";
  fs::remove_all(dir);
  RunCheckpoints save;
  save.flags.save = dir;
  save.flags.save_interval = 2;
  const Trained saving = train(o, par, opaque.get(), save);
  expect_same(straight, saving);
  absl::StatusOr<model::ckpt::Checkpoint> c = model::ckpt::Checkpoint::open(dir + "/iter_0000002");
  ASSERT_TRUE(c.ok()) << c.status();
  RunCheckpoints load;
  load.loaded = &*c;
  const Trained resumed = train(o, par, opaque.get(), load);
  ASSERT_EQ(resumed.metrics.size(), 2u);
  expect_same(straight.metrics[2], resumed.metrics[0]);
  expect_same(straight.metrics[3], resumed.metrics[1]);
  EXPECT_EQ(resumed.params, straight.params);
  fs::remove_all(dir);
}

// RankUnit::connect() meets the TP group's other members (on a GPU, to
// make NCCL's communicator; on the opaque device, the same exchange). A
// member that never comes would hold it for ever: fail_pending, which a
// worker calls when the job ends meanwhile, ends it.
TEST(DeviceRuntimeConnect, FailPendingEndsAConnectWhosePeerNeverComes) {
  std::unique_ptr<gpu::Device> opaque = gpu::make_opaque_cpu_device();
  ParallelOptions par{{.tp = 2}};
  par.device = opaque.get();
  model::TrainOptions o = fixtures::tiny4(Precision::kFp32);
  o.model = par.sliced_config(o.model);
  auto fabric = std::make_shared<comm::InProcFabric>(2);
  std::vector<std::unique_ptr<RankUnit>> units;
  for (int r = 0; r < 2; r++) {
    RankSpec spec;
    spec.options = o;
    spec.parallel = par;
    spec.rank = r;
    auto u = RankUnit::create(spec, fabric->endpoint(r));
    ASSERT_TRUE(u.ok()) << u.status();
    units.push_back(*std::move(u));
  }
  // Member 1 waits for member 0's id; member 0 never sends it.
  auto connecting = std::async(std::launch::async, [&] { return units[1]->connect(); });
  EXPECT_EQ(connecting.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  units[1]->fail_pending(absl::CancelledError("the job stopped"));
  ASSERT_EQ(connecting.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "connect() still waits after fail_pending";
  const absl::Status st = connecting.get();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "the job stopped")) << st;
}

}  // namespace
}  // namespace troupe::actors
