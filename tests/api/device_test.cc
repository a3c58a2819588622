// --device's default (api/train_flags.h, default_device): a GPU where the
// process has one for each of its host's workers and the flags can use it,
// else the CPU, with the reason. The cases are the rules as docs/CUDA.md states them.
#include <gtest/gtest.h>

#include <string>

#include "api/flag_rules.h"
#include "api/train_flags.h"
#ifdef TROUPE_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace troupe::api {
namespace {

TrainFlags layout(int tp, int pp, int dp) {
  TrainFlags f;
  f.parallel.tp = tp;
  f.parallel.pp = pp;
  f.parallel.dp = dp;
  return f;
}

TEST(DefaultDevice, NoGpuIsTheCpu) {
  for (bool per_rank : {false, true}) {
    const DefaultDevice d = default_device(layout(1, 1, 1), per_rank, 0, 1, "");
    EXPECT_EQ(d.device, "cpu");
    EXPECT_EQ(d.why, "no GPU is visible");
  }
}

TEST(DefaultDevice, OneProcessTakesTheGpuUnlessTensorParallel) {
  const DefaultDevice one = default_device(layout(1, 1, 1), false, 1, 1, "");
  EXPECT_EQ(one.device, "cuda");
  EXPECT_EQ(one.why, "1 GPU is visible");
  // Pipeline and data parallel ranks in one process share its GPU, and say so.
  const DefaultDevice shared = default_device(layout(1, 2, 2), false, 8, 1, "");
  EXPECT_EQ(shared.device, "cuda");
  EXPECT_EQ(shared.why, "8 GPUs are visible; the 4 ranks of this process share one");
  const DefaultDevice tp = default_device(layout(2, 1, 1), false, 8, 1, "");
  EXPECT_EQ(tp.device, "cpu");
  EXPECT_NE(tp.why.find("--tp 2 in one process"), std::string::npos) << tp.why;
  EXPECT_NE(tp.why.find("troupe launch"), std::string::npos) << tp.why;
}

TEST(DefaultDevice, TheFixedCostChunksAreTheCpus) {
  TrainFlags f = layout(1, 2, 1);
  f.op_cost = "1:2";
  const DefaultDevice d = default_device(f, false, 1, 1, "");
  EXPECT_EQ(d.device, "cpu");
  EXPECT_NE(d.why.find("--debug-op-cost"), std::string::npos) << d.why;
}

TEST(DefaultDevice, AGpuTooOldForTheKernelsIsTheCpuSayingWhich) {
  const std::string old = "cuda:0 (Tesla T4) is compute capability 7.5; troupe's kernels need 8.0";
  for (bool per_rank : {false, true}) {
    const DefaultDevice d = default_device(layout(1, 1, 1), per_rank, 1, 1, old);
    EXPECT_EQ(d.device, "cpu");
    EXPECT_EQ(d.why, old);
  }
}

TEST(DefaultDevice, AWorkerNeedsAGpuOfItsOwn) {
  // Four workers on a host (pipeline parallel: the rule holds without NCCL
  // too): four GPUs (or more) serve them, two do not.
  EXPECT_EQ(default_device(layout(1, 4, 1), true, 4, 4, "").device, "cuda");
  EXPECT_EQ(default_device(layout(1, 4, 1), true, 8, 4, "").device, "cuda");
  const DefaultDevice few = default_device(layout(1, 4, 1), true, 2, 4, "");
  EXPECT_EQ(few.device, "cpu");
  EXPECT_EQ(few.why.rfind("4 workers on this host but 2 GPUs are visible: each worker needs a GPU "
                          "of its own",
                          0),
            0u)
      << few.why;
  // One visible GPU for four workers: shared (CUDA_VISIBLE_DEVICES=0 for
  // all), or each its own (one value per worker); the default cannot tell,
  // and takes the CPU.
  EXPECT_EQ(default_device(layout(1, 4, 1), true, 1, 4, "").device, "cpu");
  // With a process per rank, TP takes the GPUs where NCCL is built in.
#ifdef TROUPE_HAVE_NCCL
  EXPECT_EQ(default_device(layout(2, 2, 1), true, 4, 4, "").device, "cuda");
#else
  EXPECT_EQ(default_device(layout(2, 2, 1), true, 4, 4, "").device, "cpu");
#endif
}

TEST(ResolveDevice, AGivenDeviceStays) {
  for (const char* given : {"cpu", "cuda", "opaque"}) {
    TrainFlags f = layout(1, 1, 1);
    f.device = given;
    EXPECT_EQ(resolve_device(f, false), "");
    EXPECT_EQ(f.device, given);
  }
}

TEST(ResolveDevice, WithoutAGpuTheDefaultIsTheCpuAndSaysNothing) {
#ifdef TROUPE_HAVE_CUDA
  if (gpu::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible here";
#endif
  TrainFlags f = layout(1, 1, 1);
  EXPECT_EQ(resolve_device(f, false), "");
  EXPECT_EQ(f.device, "cpu");
}

// --attention-kernel's default follows the device: flash on the CPU (and
// the opaque device), the reference kernel on CUDA until gpu-check has
// verified the flash one there; a given kernel stays; a bad one is named.
TEST(ResolveAttention, TheDefaultIsFlashButOnCudaUntilVerified) {
  auto kernel = [](const std::string& device, const std::string& flag) {
    TrainFlags f;
    f.device = device;
    f.attention_kernel = flag;
    model::ActivationOptions a;
    EXPECT_TRUE(resolve_attention(f, &a).ok());
    return a.attention;
  };
  using model::AttentionKernel;
  EXPECT_EQ(kernel("cpu", ""), AttentionKernel::kFlash);
  EXPECT_EQ(kernel("opaque", ""), AttentionKernel::kFlash);
  // (Pinned: when gpu-check has verified the CUDA kernel, this changes with
  // model/config.cc's kCudaFlashVerified.)
  EXPECT_EQ(kernel("cuda", ""), AttentionKernel::kReference);
  // No device yet (troupe launch): this host's, as a worker would take it.
  TrainFlags probe;
  resolve_device(probe, /*process_per_rank=*/true);
  EXPECT_EQ(kernel("", ""),
            probe.device == "cuda" ? AttentionKernel::kReference : AttentionKernel::kFlash);
  EXPECT_EQ(kernel("cuda", "flash"), AttentionKernel::kFlash);
  EXPECT_EQ(kernel("cpu", "reference"), AttentionKernel::kReference);
  TrainFlags f;
  f.attention_kernel = "fast";
  model::ActivationOptions a;
  EXPECT_EQ(resolve_attention(f, &a).message(),
            "--attention-kernel 'fast': use flash or reference");
}

}  // namespace
}  // namespace troupe::api
