// What the runtime tests share: the small model they train, and a layout's
// run with what it ended with.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "actors/runtime/in_process.h"
#include "gpu/device.h"
#include "model/trainer.h"
#include "tests/tiny_model.h"

namespace troupe::actors::fixtures {

using troupe::fixtures::in_precision;
using troupe::fixtures::Tiny;
using troupe::fixtures::tiny;

// tiny with 4 layers (pp 2 with 2 chunks a stage splits it evenly),
// micro-batches of 2, a global batch of 8, 10 steps, in `p`.
inline model::TrainOptions tiny4(gpu::Precision p) {
  return fixtures::tiny({.layers = 4,
                         .micro_batch = 2,
                         .global_batch = 8,
                         .steps = 10,
                         .warmup_iters = 2,
                         .decay_iters = 10,
                         .activations = fixtures::in_precision(p)});
}

struct Trained {
  std::vector<model::StepMetrics> metrics;
  std::vector<float> params;  // the whole model's, gathered after the last step
};

// Runs `o` on the layout `par` (its ranks on `device`, null: the CPU), with
// checkpoints `ck`.
inline Trained train_layout(const model::TrainOptions& o, ParallelOptions par,
                            gpu::Device* device = nullptr, const RunCheckpoints& ck = {}) {
  Trained r;
  par.device = device;
  const std::int64_t before = device != nullptr ? device->allocated_bytes() : 0;
  auto t = InProcessTrainer::create(o, par, nullptr, ck);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return r;
  // The ranks' buffers are the given device's.
  if (device != nullptr) {
    EXPECT_GT(device->allocated_bytes(), before);
  }
  absl::Status st = (*t)->run([&](const model::StepMetrics& m) { r.metrics.push_back(m); });
  EXPECT_TRUE(st.ok()) << st;
  model::Gpt whole((*t)->options().model, 1, gpu::cpu_device());
  st = (*t)->gather_params(whole);
  EXPECT_TRUE(st.ok()) << st;
  const float* p = whole.params().host<float>();
  r.params.assign(p, p + whole.params().numel());
  return r;
}

}  // namespace troupe::actors::fixtures
