// The stall watchdog (--stall-timeout) counts completed ops as progress: a
// compute phase that sends the coordinator nothing for longer than the
// timeout, while its ops keep completing, is not a hang; a stage that
// stops is still reported, naming what it waits for.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "actors/runtime/in_process.h"
#include "tests/tiny_model.h"

namespace troupe::actors {
namespace {

// A GPT chunk whose forward and backward only take time (a sleep on the
// stream), so the phases' lengths do not depend on the machine's speed.
class SleepingStage : public GptStage {
 public:
  SleepingStage(const model::GptConfig& c, int B, const model::StageSpec& spec, int slots,
                int backward_ms)
      : GptStage(c, B, spec, slots, gpu::cpu_device()), backward_ms_(backward_ms) {
    gpu::check_invariant(gpt().init(1), "StalledStage");
    for (int k = 0; k < slots; k++) std::memset(losses(k).data<float>(), 0, losses(k).nbytes());
  }
  void forward(gpu::Stream&, int, const gpu::Tensor&, const gpu::Tensor&) override {}
  void backward(gpu::Stream& s, int, const gpu::Tensor&, const gpu::Tensor&, float,
                const model::GradProgress& progress, bool) override {
    s.host_callback(
        [ms = backward_ms_] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
    if (!progress) return;
    using P = model::GradPoint::Part;
    if (spec().head) progress({P::kHead, -1});
    for (int l = spec().last_layer - 1; l >= spec().first_layer; l--) progress({P::kLayer, l});
    if (spec().embedding) progress({P::kEmbedding, -1});
  }

 private:
  int backward_ms_;
};

model::TrainOptions small(int m) {
  return fixtures::tiny({.layers = 2, .micro_batch = 1, .global_batch = m, .steps = 2});
}

// GPipe at pp = 1: the m forwards report their losses at once, then the m
// backwards (100 ms each) run for 0.8 s with no message to the coordinator
// until the norms: more than twice the 0.3 s timeout.
TEST(StallWatchdog, ALongComputePhaseWhoseOpsCompleteIsNotAHang) {
  const int m = 8;
  auto factory = [](const StageRequest& r) {
    return std::make_unique<SleepingStage>(r.config, r.B, r.spec, r.slots, 100);
  };
  ParallelOptions par{{.pp = 1, .dp = 1}, ScheduleKind::kGPipe};
  par.stall_timeout_s = 0.3;
  auto t = InProcessTrainer::create(small(m), par, factory);
  ASSERT_TRUE(t.ok()) << t.status();
  int steps = 0;
  absl::Status st = (*t)->run([&](const model::StepMetrics&) { steps++; });
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(steps, 2);
}

// A stage that never begins step 2 is still found, within two timeouts.
TEST(StallWatchdog, AStageThatStopsIsStillReported) {
  ParallelOptions par{{.pp = 2, .dp = 1}, ScheduleKind::k1F1B};
  par.stall_timeout_s = 0.3;
  par.fail = {.stage = 1, .step = 2, .kind = FailPoint::Kind::kStall};
  auto t = InProcessTrainer::create(small(2), par);
  ASSERT_TRUE(t.ok()) << t.status();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = (*t)->run(nullptr);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("no progress for 0.3 s in step 2"), std::string::npos) << st;
  EXPECT_NE(st.message().find("has not begun step 2"), std::string::npos) << st;
  EXPECT_LT(secs, 5.0);
}

// The same on a device whose pipeline goes through links (the opaque
// device): stage 0's stream waits in its link for stage 1's gradient, and
// the report follows that wait to stage 1 instead of blaming stage 0's
// stream (a regression: a rank whose stream waited in a link was a root).
TEST(StallWatchdog, AStageThatStopsIsReportedThroughThePipelineLinks) {
  std::unique_ptr<gpu::Device> opaque = gpu::make_opaque_cpu_device();
  ParallelOptions par{{.pp = 2, .dp = 1}, ScheduleKind::k1F1B};
  par.stall_timeout_s = 0.3;
  par.fail = {.stage = 1, .step = 2, .kind = FailPoint::Kind::kStall};
  par.device = opaque.get();
  auto t = InProcessTrainer::create(small(2), par);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::Status st = (*t)->run(nullptr);
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("has not begun step 2"), std::string::npos) << st;
  EXPECT_EQ(st.message().find("its stream has not finished"), std::string::npos) << st;
}

}  // namespace
}  // namespace troupe::actors
