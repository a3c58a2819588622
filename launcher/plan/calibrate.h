// `troupe plan calibrate`: measures this machine as the planner's cluster
// `this-machine`, where one "GPU" is one rank with its share of the cores.
// For each thread count a rank can get (1, 2, 4, ... up to the cores) it
// times, on a CPU stream of that many threads, troupe's own kernels at the
// model's shapes (tp 1 and 2), the fastest of --reps runs after a warm-up:
//   - every GEMM of a layer and the LM head, forward and backward, and fits
//     the GEMM curve of launcher/plan/hardware.h to them (least squares in log time);
//   - the fused attention forward and backward (FLOP/s);
//   - each memory-bound family (LayerNorm, GELU, residual, embedding,
//     cross-entropy, axpy, fill, AdamW, norm) as bytes moved per second by
//     the same byte counts the cost model uses;
// and, once, a point-to-point message's latency and bandwidth over the
// in-process transport and over UCX between two endpoints on this host.
//
//   plan::CalibrateOptions o{.model = *model::preset("cpu-small"), .micro_batch = 4};
//   absl::StatusOr<std::string> json = plan::calibrate(o, &std::cout);
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"

namespace troupe::launcher::plan {

struct CalibrateOptions {
  model::GptConfig model;
  int micro_batch = 4;
  std::vector<int> threads;  // empty: 1, 2, 4, ... and the cores
  int reps = 5;              // timed runs of each kernel after a warm-up (the fastest counts)
};

// The this-machine cluster file's text; progress lines go to `log`.
absl::StatusOr<std::string> calibrate(const CalibrateOptions& o, std::ostream& log);

// The GEMM curve's fit (exposed for tests): times of GEMMs (M, N, K) in
// seconds; fills peak and m0, n0, k0 of the best fit on a log grid.
struct GemmPoint {
  double M = 0, N = 0, K = 0, seconds = 0;
};
struct GemmFit {
  double peak_flops = 0, m0 = 0, n0 = 0, k0 = 0;
  double rms_log_error = 0;  // of the fit over the points
};
GemmFit fit_gemm_curve(const std::vector<GemmPoint>& points, double flops_factor);

}  // namespace troupe::launcher::plan
