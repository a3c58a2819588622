// The small model the tests train, made in one place: the preset "tiny"
// (L 4, C 64, NH 4, T 64, V 512) with what a test changes named at its
// call, and one thread a stream by default (ctest runs two tests at once
// on two cores). Each field left alone keeps TrainOptions' own default.
//
//   model::TrainOptions o = fixtures::tiny({.layers = 8, .micro_batch = 2, .global_batch = 32,
//                                           .steps = 10, .warmup_iters = 2, .decay_iters = 10});
#pragma once

#include "model/config.h"
#include "model/trainer.h"

namespace troupe::fixtures {

struct Tiny {
  int layers = 0;  // 0: the preset's
  int vocab = 0;   // 0: the preset's
  int micro_batch = 2;
  int global_batch = 8;
  int steps = 10;
  int warmup_iters = 0;  // the learning rate's (model/optimizer.h; 0: none)
  int decay_iters = 0;   // 0: no decay
  int eval_interval = 0;
  int eval_iters = 0;
  int threads = 1;
  model::ActivationOptions activations = {};  // precision, recompute, sequence parallelism
};

inline model::TrainOptions tiny(const Tiny& t) {
  model::TrainOptions o;
  o.model = *model::preset("tiny");
  if (t.layers > 0) o.model.L = t.layers;
  if (t.vocab > 0) o.model.V = t.vocab;
  o.micro_batch = t.micro_batch;
  o.global_batch = t.global_batch;
  o.steps = t.steps;
  o.lr.warmup_iters = t.warmup_iters;
  o.lr.decay_iters = t.decay_iters;
  o.eval_interval = t.eval_interval;
  o.eval_iters = t.eval_iters;
  o.threads = t.threads;
  o.activations = t.activations;
  return o;
}

// The same in `precision`, the other activation options at their defaults.
inline model::ActivationOptions in_precision(gpu::Precision precision) {
  model::ActivationOptions a;
  a.precision = precision;
  return a;
}

}  // namespace troupe::fixtures
