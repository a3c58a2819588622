// The hardware `troupe plan` predicts for: clusters as data. Rates are in
// gigabytes (not bits) per second: an HDR InfiniBand NIC of 200 Gb/s is
// `"gbytes_per_s_per_nic": 25`. A cluster is a
// JSON file (launcher/plan/clusters/*.json, built into the binary; or any file
// given by path) with the vendor's figures per GPU (dense peak TFLOP/s per
// precision, memory and its bandwidth), GPUs per node, the intra-node link
// and the inter-node network (NICs per node, bandwidth and latency each),
// the efficiencies assumed, and the sources of every figure. `this-machine`
// is what `troupe plan calibrate` measured here (launcher/plan/calibrate.h):
// one "GPU" is one rank with its share of the cores, as the runtime gives it.
//
//   absl::StatusOr<plan::Cluster> c = plan::load_cluster("dgx-a100-80gb-selene");
//   plan::Device d = c->device(/*ranks_on_node=*/8, plan::Precision::kBf16);
//   double s = d.compute.gemm_seconds(2048, 7680, 20480, plan::Pass::kForward);
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::launcher::plan {

enum class Precision { kBf16, kFp16, kTf32, kFp32 };
absl::StatusOr<Precision> parse_precision(const std::string& name);
std::string precision_name(Precision p);
inline double element_bytes(Precision p) {
  return p == Precision::kBf16 || p == Precision::kFp16 ? 2 : 4;
}

enum class GemmPass { kForward, kBackward };

// GEMM efficiency as a function of shape (the documented curve): `batch`
// GEMMs of M x N x K in one kernel (attention's batched GEMMs; 1 otherwise)
// take
//   time = fixed + batch * 2MNK / (peak * e(M,N,K)) * q,
//   e(M,N,K) = M/(M+m0) * N/(N+n0) * K/(K+k0)
// peak is the best rate times the share reached in training; m0, n0, k0 are
// the sizes at which one dimension alone halves it; fixed is a kernel's
// fixed cost (its ramp and tail, with the launch where it is not hidden).
// q is the last wave's quantisation on a GPU of `sms` multiprocessors
// (NVIDIA's "Matrix Multiplication Background" guide, section 3): each
// output is cut into tiles of tile_m x tile_n, either way round, or squares
// of the smaller side (whichever wastes least: cuBLAS's heuristics pick
// among its tiles), and a kernel of w waves pays for all w even when its
// last is partly empty (whole waves only: a tile's padding at a ragged
// edge is left to the curve, which charges small dimensions already). Under one wave cuBLAS takes
// smaller tiles or splits K, which the smooth curve covers (q = 1); above, the step at each wave is
// kept (no stream-K, as the cuBLAS of the published runs). For GPU clusters
// the figures come from each file's "efficiency" (see bench/gemm_fit.py);
// for this-machine they are fitted to GEMMs timed at the model's shapes,
// with no fixed cost or waves.
struct GemmCurve {
  double peak_flops = 1;  // FLOP/s
  double m0 = 0, n0 = 0, k0 = 0;
  double launch_s = 0;  // the fixed cost ("gemm_launch_us")
  int sms = 0;          // 0: no wave quantisation
  double tile_m = 256, tile_n = 128;
  double efficiency(double M, double N, double K) const {
    return M / (M + m0) * N / (N + n0) * K / (K + k0);
  }
  // q >= 1: whole waves of tiles over the tiles.
  double wave_quantisation(double M, double N, double batch = 1) const;
  double seconds(double M, double N, double K, double batch = 1) const {
    return launch_s + batch * 2 * M * N * K / (peak_flops * efficiency(M, N, K)) *
                          wave_quantisation(M, N, batch);
  }
};

// An alpha-beta link: latency + bytes / bandwidth.
struct Link {
  double latency_s = 0;
  double bytes_per_s = 1;
  double seconds(double bytes) const { return latency_s + bytes / bytes_per_s; }
};

// How fast one rank computes: GEMMs by the curve, attention (GPU: batched
// GEMMs and a softmax; this-machine: troupe's fused kernel at its measured
// FLOP rate) and memory-bound ops by the bytes they move at the rate of
// their family (GPU: one HBM rate; this-machine: each family measured).
struct Compute {
  GemmCurve gemm_fwd, gemm_bwd;
  bool fused_attention = false;  // this-machine's CPU kernel
  // GPUs: the backward's two GEMMs as cuBLAS runs them, the input gradient
  // (M x K, over N) and the weight gradient (K x N, over M); this-machine: twice
  // the forward's shape (as calibrate times it).
  bool transposed_backward = false;
  double attention_fwd_flops = 0, attention_bwd_flops = 0;  // FLOP/s when fused (flash)
  double reference_attention_fwd_flops = 0, reference_attention_bwd_flops = 0;  // reference
  double memory_bytes_per_s = 1;  // any family not listed below
  // A memory-bound kernel's fixed cost (GPU clusters: the GEMM curve's,
  // assumed the same; this-machine: none, the rates are of whole ops).
  double kernel_s = 0;
  std::map<std::string, double> family_bytes_per_s;  // measured families
  double slowdown = 1;  // the optimizer's with more ranks than cores (Device::core_share)
  // this-machine: GEMMs timed at exactly these (M, N, K) are taken as
  // measured (seconds forward, backward); the curve is for other shapes.
  // (oneDNN's sgemm is not smooth in the shape: here 1024x768x256 runs at
  // 40% of 1024x512x256's rate, which no monotone curve follows.)
  std::map<std::array<double, 3>, std::array<double, 2>> gemm_measured;

  double gemm_seconds(double M, double N, double K, GemmPass pass, double batch = 1) const;
  // Of the backward, the weight gradient alone (a zero-bubble schedule's W).
  double weight_grad_seconds(double M, double N, double K) const;
  // `bytes` moved by a kernel of `family` (its own kernel, or fused into the
  // one before: no fixed cost).
  double memory_seconds(double bytes, const std::string& family, bool own_kernel = true) const;
};

struct Device {
  Compute compute;
  Compute optimizer;  // the optimizer partitions' stream (this-machine: one thread, as RankUnit
                      // makes it)
  Link intra;         // to a rank on the same node
  Link inter;         // to a rank on another node (this GPU's share of the NICs)
  double memory_bytes = 0;  // per GPU (this-machine: the RAM's share of a rank)
  double peak_flops = 0;    // dense, at the chosen precision (this-machine: the fitted GEMM peak)
  // this-machine with more ranks than cores: ranks / cores. The ranks take
  // turns on the cores, so `compute` is a rank's speed alone on a core
  // and make_plan bounds the pipeline by every rank's compute over the
  // cores (one rank's bubble is another's compute) and reports as bubble
  // the cores' idle share; `optimizer` is slowed by it, as every rank
  // steps at once.
  double core_share = 1;
};

struct Cluster {
  std::string name, description, file;
  bool calibrated = false;  // this-machine
  int nodes = 1, gpus_per_node = 1;
  std::string gpu_name;
  std::map<Precision, double> peak_tflops;
  double memory_gib = 0, memory_gbytes_per_s = 0;
  Link intra, inter;  // per GPU, one direction (intra at NCCL's achieved share of the link)
  int nics_per_node = 0;
  GemmCurve gemm;  // at peak_flops = 1 (scaled per precision)
  double gemm_max_efficiency = 1, memory_efficiency = 1;
  std::vector<std::string> sources;
  std::string assumptions;
  // this-machine: a Compute per thread count, and the two transports.
  int cores = 1;
  std::map<int, Compute> by_threads;
  Link inproc, ucx;
  std::string calibrated_model;

  std::int64_t max_gpus() const { return static_cast<std::int64_t>(nodes) * gpus_per_node; }
  // What one rank gets when `ranks_on_node` share a node. InvalidArgument
  // for a precision the cluster has no figure for (this-machine: fp32 only).
  absl::StatusOr<Device> device(int ranks_on_node, Precision precision,
                                bool ucx_transport = false) const;
};

// Built-in names (launcher/plan/clusters/*.json), in order.
std::vector<std::string> cluster_names();
// Where calibrate writes this-machine and --cluster this-machine reads it:
// $TROUPE_CLUSTER_DIR/this-machine.json, else
// $XDG_CACHE_HOME/troupe/this-machine.json, else ~/.cache/troupe/.
std::string this_machine_path();
// A built-in name, `this-machine`, or a path to a cluster file. NotFound
// names the choices (and, for this-machine, says to calibrate);
// InvalidArgument names the file and the field at fault.
absl::StatusOr<Cluster> load_cluster(const std::string& name_or_path);
absl::StatusOr<Cluster> parse_cluster(const std::string& text, const std::string& file);

}  // namespace troupe::launcher::plan
