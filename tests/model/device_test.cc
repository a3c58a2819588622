// The single-rank loop on a device whose memory the host cannot read (gpu::
// make_opaque_cpu_device: the CPU's kernels, a GPU's rule that device data
// reaches the host only by ops::copy). Every host read of device memory
// throws there, so a trainer that steps, evaluates, checkpoints and resumes
// on it, bitwise as on the CPU device, reads the device only through its
// copies, as it must on a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/ops.h"
#include "model/checkpoint.h"
#include "model/trainer.h"
#include "tests/tiny_model.h"

namespace troupe::model {
namespace {

namespace fs = std::filesystem;
using gpu::Precision;

TrainOptions device_tiny(int steps, Precision p) {
  TrainOptions o = fixtures::tiny({.micro_batch = 2,
                                   .global_batch = 4,  // two micro-batches: accumulation
                                   .steps = steps,
                                   .warmup_iters = 1,
                                   .decay_iters = steps,
                                   .eval_interval = 2,
                                   .eval_iters = 1,
                                   .threads = 2,
                                   .activations = fixtures::in_precision(p)});
  if (p == Precision::kFp16) {
    o.loss_scale.initial = 0x1p32f;  // the first steps overflow: skips
    o.loss_scale.hysteresis = 1;
  }
  return o;
}

// The parameters, copied explicitly (the opaque device refuses host reads).
std::vector<float> params_of(Trainer& t) {
  const gpu::Tensor& p = t.gpt().params();
  std::vector<float> out(static_cast<std::size_t>(p.numel()));
  EXPECT_TRUE(p.device()->copy_to_host(p, out.data()).ok());
  return out;
}

void expect_same(const StepMetrics& a, const StepMetrics& b) {
  SCOPED_TRACE(::testing::Message() << "step " << a.step);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
  EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)), 0)
      << a.grad_norm << " vs " << b.grad_norm;
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.loss_scale, b.loss_scale);
  EXPECT_EQ(a.skipped, b.skipped);
  EXPECT_EQ(a.val_loss.has_value(), b.val_loss.has_value());
  if (a.val_loss && b.val_loss) {
    EXPECT_EQ(*a.val_loss, *b.val_loss);
  }
}

class OpaqueDevice : public ::testing::TestWithParam<Precision> {
 protected:
  std::unique_ptr<gpu::Device> opaque_ = gpu::make_opaque_cpu_device();
};

TEST_P(OpaqueDevice, TrainsBitwiseAsTheCpuDevice) {
  const TrainOptions o = device_tiny(4, GetParam());
  auto cpu = Trainer::create(o);
  auto opq = Trainer::create(o, *opaque_);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(opq.ok()) << opq.status();
  // The guard is real: the trainer's own tensors refuse a host read.
  EXPECT_THROW((void)(*opq)->gpt().params().host<float>(), gpu::InvariantError);
  int skipped = 0, evaluated = 0;
  for (int i = 0; i < o.steps; i++) {
    StepMetrics a, b;
    ASSERT_TRUE((*cpu)->step(&a).ok());
    absl::Status st = (*opq)->step(&b);
    ASSERT_TRUE(st.ok()) << st;
    expect_same(a, b);
    skipped += b.skipped ? 1 : 0;
    evaluated += b.val_loss ? 1 : 0;
  }
  EXPECT_EQ(evaluated, 2);
  if (GetParam() == Precision::kFp16) {
    EXPECT_GT(skipped, 0);  // the skip path ran too
  }
  EXPECT_TRUE(params_of(**cpu) == params_of(**opq));
}

// A checkpoint saved from the opaque device and resumed on it continues
// bitwise as the straight run on the CPU device: the state went to the host
// and back by copies.
TEST_P(OpaqueDevice, SavesAndResumesThroughCopies) {
  const TrainOptions o = device_tiny(4, GetParam());
  const std::string dir =
      (fs::temp_directory_path() / ("troupe_device_test_" + std::to_string(::getpid()) + "_" +
                                    std::string(gpu::precision_name(GetParam()))))
          .string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<StepMetrics> straight;
  {
    auto t = Trainer::create(o);
    ASSERT_TRUE(t.ok());
    for (int i = 0; i < o.steps; i++) {
      StepMetrics m;
      ASSERT_TRUE((*t)->step(&m).ok());
      straight.push_back(m);
    }
  }
  {
    auto t = Trainer::create(o, *opaque_);
    ASSERT_TRUE(t.ok());
    for (int i = 0; i < 2; i++) {
      StepMetrics m;
      ASSERT_TRUE((*t)->step(&m).ok());
    }
    absl::StatusOr<std::vector<ckpt::Piece>> pieces = (*t)->checkpoint_pieces(true);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    ckpt::Meta meta;
    meta.step = (*t)->steps_done();
    meta.consumed_samples = o.batches().consumed_before(meta.step + 1);
    meta.evaluations_done = (*t)->evaluations_done();
    meta.loss_scale = (*t)->loss_scaler().state();
    meta.options = o;
    meta.writer = ckpt::writer_name();
    absl::StatusOr<std::string> tmp = ckpt::begin_save(dir, meta.step);
    ASSERT_TRUE(tmp.ok()) << tmp.status();
    auto records = ckpt::write_rank_file(*tmp, 0, *pieces);
    ASSERT_TRUE(records.ok()) << records.status();
    ASSERT_TRUE(ckpt::commit(dir, *tmp, meta, *records, 0).ok());
  }
  absl::StatusOr<ckpt::Checkpoint> c = ckpt::Checkpoint::open(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  auto t = Trainer::create(o, *opaque_);
  ASSERT_TRUE(t.ok());
  absl::Status st = (*t)->load_checkpoint(*c, /*optimizer=*/true);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*t)->steps_done(), 2);
  for (int i = 2; i < o.steps; i++) {
    StepMetrics m;
    ASSERT_TRUE((*t)->step(&m).ok());
    expect_same(straight[static_cast<std::size_t>(i)], m);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Precisions, OpaqueDevice,
                         ::testing::Values(Precision::kFp32, Precision::kBf16, Precision::kFp16),
                         [](const ::testing::TestParamInfo<Precision>& p) {
                           return std::string(gpu::precision_name(p.param));
                         });

}  // namespace
}  // namespace troupe::model
