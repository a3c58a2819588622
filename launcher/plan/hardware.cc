// Cluster files: parsing, checking, and what one rank of them gets.
#include "launcher/plan/hardware.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "launcher/plan/clusters.h"

namespace troupe::launcher::plan {

using nlohmann::json;

absl::StatusOr<Precision> parse_precision(const std::string& name) {
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  if (name == "tf32") return Precision::kTf32;
  if (name == "fp32") return Precision::kFp32;
  return absl::InvalidArgumentError(
      absl::StrCat("--precision '", name, "': use bf16, fp16, tf32 or fp32"));
}

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kTf32:
      return "tf32";
    case Precision::kFp32:
      return "fp32";
  }
  return "?";
}

double GemmCurve::wave_quantisation(double M, double N, double batch) const {
  if (sms <= 0) return 1;
  const double small = std::min(tile_m, tile_n);
  double best = 0;
  for (const auto& [a, b] :
       {std::pair{tile_m, tile_n}, std::pair{tile_n, tile_m}, std::pair{small, small}}) {
    const double tiles = batch * std::ceil(M / a) * std::ceil(N / b);
    // Whole waves only: a tile's padding past a ragged edge is the curve's
    // (e's M/(M+m0) and N/(N+n0) charge small dimensions already).
    const double q = tiles < sms ? 1 : std::ceil(tiles / sms) * sms / tiles;
    best = best == 0 ? q : std::min(best, q);
  }
  return best;
}

double Compute::gemm_seconds(double M, double N, double K, GemmPass pass, double batch) const {
  if (auto it = gemm_measured.find({M, N, K}); it != gemm_measured.end()) {
    return batch * it->second[pass == GemmPass::kForward ? 0 : 1] * slowdown;
  }
  if (pass == GemmPass::kForward) return gemm_fwd.seconds(M, N, K, batch) * slowdown;
  // The backward: the input and the weight gradients.
  if (transposed_backward) {
    return (gemm_bwd.seconds(M, K, N, batch) + gemm_bwd.seconds(K, N, M, batch)) * slowdown;
  }
  return 2 * gemm_bwd.seconds(M, N, K, batch) * slowdown;
}

double Compute::weight_grad_seconds(double M, double N, double K) const {
  if (auto it = gemm_measured.find({M, N, K}); it != gemm_measured.end()) {
    return 0.5 * it->second[1] * slowdown;
  }
  if (transposed_backward) return gemm_bwd.seconds(K, N, M) * slowdown;
  return gemm_bwd.seconds(M, N, K) * slowdown;
}

double Compute::memory_seconds(double bytes, const std::string& family, bool own_kernel) const {
  auto it = family_bytes_per_s.find(family);
  return ((own_kernel ? kernel_s : 0) +
          bytes / (it != family_bytes_per_s.end() ? it->second : memory_bytes_per_s)) *
         slowdown;
}

absl::StatusOr<Device> Cluster::device(int ranks_on_node, Precision precision,
                                       bool ucx_transport) const {
  Device d;
  if (calibrated) {
    if (precision != Precision::kFp32) {
      return absl::InvalidArgumentError(
          absl::StrCat("--precision ", precision_name(precision), ": ", name,
                       " is calibrated in fp32 only (`troupe plan calibrate` times fp32 "
                       "GEMMs); use --precision fp32"));
    }
    // The runtime gives each rank cores / ranks threads (at least one).
    const int threads = std::max(1, cores / std::max(1, ranks_on_node));
    auto it = by_threads.upper_bound(threads);
    if (it == by_threads.begin()) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, ": ", ranks_on_node, " ranks get ", threads, " thread", threads == 1 ? "" : "s",
          " each, but the calibration starts at ", by_threads.begin()->first,
          "; run troupe plan calibrate with --threads ", threads));
    }
    --it;  // the largest calibrated thread count not above it
    d.compute = it->second;
    d.optimizer = by_threads.begin()->second;  // the fewest threads calibrated: 1 by default
    if (ranks_on_node > cores) {
      d.core_share = d.optimizer.slowdown = static_cast<double>(ranks_on_node) / cores;
    }
    d.intra = ucx_transport ? ucx : inproc;
    d.inter = ucx;
    d.memory_bytes = memory_gib * std::pow(2.0, 30) / std::max(1, ranks_on_node);
    d.peak_flops = d.compute.gemm_fwd.peak_flops;
    return d;
  }
  auto peak = peak_tflops.find(precision);
  if (peak == peak_tflops.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--precision ", precision_name(precision), ": ",
                                                   file, " gives no peak for it"));
  }
  d.peak_flops = peak->second * 1e12;
  d.compute.gemm_fwd = gemm;
  d.compute.gemm_fwd.peak_flops = d.peak_flops * gemm_max_efficiency;
  d.compute.gemm_bwd = d.compute.gemm_fwd;
  d.compute.transposed_backward = true;
  d.compute.kernel_s = gemm.launch_s;
  d.compute.memory_bytes_per_s = memory_gbytes_per_s * 1e9 * memory_efficiency;
  d.optimizer = d.compute;
  d.intra = intra;
  d.inter = inter;
  d.memory_bytes = memory_gib * std::pow(2.0, 30);
  return d;
}

std::vector<std::string> cluster_names() {
  std::vector<std::string> names;
  for (const BuiltinCluster& c : builtin_clusters()) names.emplace_back(c.name);
  names.emplace_back("this-machine");
  return names;
}

std::string this_machine_path() {
  if (const char* d = std::getenv("TROUPE_CLUSTER_DIR"); d != nullptr && *d != '\0') {
    return absl::StrCat(d, "/this-machine.json");
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    return absl::StrCat(x, "/troupe/this-machine.json");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : ".", "/.cache/troupe/this-machine.json");
}

namespace {

// Reads one field, with errors that name the file and the field.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}
  absl::Status status() const { return status_; }

  const json* at(const json& j, const std::string& path) {
    const json* cur = &j;
    std::string walked;
    for (const std::string& key : split(path)) {
      walked = walked.empty() ? key : absl::StrCat(walked, ".", key);
      if (!cur->is_object() || !cur->contains(key)) {
        fail(absl::StrCat("missing field '", walked, "'"));
        return nullptr;
      }
      cur = &(*cur)[key];
    }
    return cur;
  }
  double number(const json& j, const std::string& path, double lo, double hi) {
    const json* v = at(j, path);
    if (v == nullptr) return lo;
    if (!v->is_number()) {
      fail(absl::StrCat("field '", path, "' must be a number"));
      return lo;
    }
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) {
      fail(absl::StrCat("field '", path, "' is ", x, ", outside [", lo, ", ", hi, "]"));
      return lo;
    }
    return x;
  }
  // A whole number in [lo, hi].
  int integer(const json& j, const std::string& path, int lo, int hi) {
    const double x = number(j, path, lo, hi);
    if (x != std::floor(x)) fail(absl::StrCat("field '", path, "' must be a whole number, is ", x));
    return static_cast<int>(x);
  }
  bool has(const json& j, const std::string& path) const {
    const json* cur = &j;
    for (const std::string& key : split(path)) {
      if (!cur->is_object() || !cur->contains(key)) return false;
      cur = &(*cur)[key];
    }
    return true;
  }
  std::string text(const json& j, const std::string& path) {
    const json* v = at(j, path);
    if (v == nullptr) return "";
    if (!v->is_string()) {
      fail(absl::StrCat("field '", path, "' must be a string"));
      return "";
    }
    return v->get<std::string>();
  }
  // Every key of the object at `path` ("" the top) is one of `known`: a
  // misspelt optional field is an error, not a silent default.
  void only(const json& j, const std::string& path, std::initializer_list<const char*> known) {
    const json* obj = path.empty() ? &j : (has(j, path) ? at(j, path) : nullptr);
    if (obj == nullptr || !obj->is_object()) return;
    for (auto it = obj->begin(); it != obj->end(); ++it) {
      bool ok = false;
      for (const char* k : known) ok = ok || it.key() == k;
      if (!ok) fail(absl::StrCat("unknown field '", path.empty() ? "" : path + ".", it.key(), "'"));
    }
  }
  void fail(const std::string& why) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(absl::StrCat(file_, ": ", why));
  }

 private:
  static std::vector<std::string> split(const std::string& path) {
    std::vector<std::string> out;
    std::stringstream ss(path);
    for (std::string part; std::getline(ss, part, '.');) out.push_back(part);
    return out;
  }
  std::string file_;
  absl::Status status_;
};

GemmCurve read_curve(Reader& r, const json& j, const std::string& at) {
  GemmCurve c;
  c.peak_flops = r.number(j, at + ".peak_gflops", 1e-3, 1e9) * 1e9;
  c.m0 = r.number(j, at + ".m0", 0, 1e6);
  c.n0 = r.number(j, at + ".n0", 0, 1e6);
  c.k0 = r.number(j, at + ".k0", 0, 1e6);
  return c;
}

Link read_link(Reader& r, const json& j, const std::string& at) {
  return {.latency_s = r.number(j, at + ".latency_us", 0, 1e6) * 1e-6,
          .bytes_per_s = r.number(j, at + ".gbytes_per_s", 1e-6, 1e6) * 1e9};
}

void read_calibration(Reader& r, const json& j, Cluster& c) {
  c.cores = r.integer(j, "cores", 1, 4096);
  c.calibrated_model = r.text(j, "calibration.model");
  c.inproc = read_link(r, j, "calibration.inproc");
  c.ucx = read_link(r, j, "calibration.ucx");
  const json* list = r.at(j, "calibration.threads");
  if (list == nullptr) return;
  if (!list->is_array() || list->empty()) {
    r.fail("field 'calibration.threads' must be a non-empty list");
    return;
  }
  for (std::size_t i = 0; i < list->size(); i++) {
    const json& e = (*list)[i];
    Compute k;
    const int threads = r.integer(e, "threads", 1, 4096);
    k.gemm_fwd = read_curve(r, e, "gemm_fwd");
    k.gemm_bwd = read_curve(r, e, "gemm_bwd");
    k.fused_attention = true;
    k.attention_fwd_flops = r.number(e, "attention_fwd_gflops", 1e-3, 1e9) * 1e9;
    k.attention_bwd_flops = r.number(e, "attention_bwd_gflops", 1e-3, 1e9) * 1e9;
    // The reference kernel's rates (calibrations before flash attention
    // timed only that kernel, under the names above: theirs serve both).
    k.reference_attention_fwd_flops = k.attention_fwd_flops;
    k.reference_attention_bwd_flops = k.attention_bwd_flops;
    if (e.contains("reference_attention_fwd_gflops")) {
      k.reference_attention_fwd_flops =
          r.number(e, "reference_attention_fwd_gflops", 1e-3, 1e9) * 1e9;
      k.reference_attention_bwd_flops =
          r.number(e, "reference_attention_bwd_gflops", 1e-3, 1e9) * 1e9;
    }
    k.memory_bytes_per_s = r.number(e, "memory_gbytes_per_s", 1e-3, 1e6) * 1e9;
    const json* fam = r.at(e, "family_gbytes_per_s");
    if (fam != nullptr && fam->is_object()) {
      for (auto it = fam->begin(); it != fam->end(); ++it) {
        k.family_bytes_per_s[it.key()] = r.number(*fam, it.key(), 1e-3, 1e6) * 1e9;
      }
    }
    if (const json* pts = r.at(e, "gemm_points"); pts != nullptr && pts->is_array()) {
      for (const json& p : *pts) {
        k.gemm_measured[{r.number(p, "M", 1, 1e9), r.number(p, "N", 1, 1e9),
                         r.number(p, "K", 1, 1e9)}] = {r.number(p, "fwd_s", 1e-12, 1e6),
                                                       r.number(p, "bwd_s", 1e-12, 1e6)};
      }
    }
    c.by_threads[threads] = k;
  }
}

}  // namespace

absl::StatusOr<Cluster> parse_cluster(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  }
  Reader r(file);
  Cluster c;
  c.file = file;
  c.name = r.text(j, "name");
  c.description = r.text(j, "description");
  c.nodes = r.integer(j, "nodes", 1, 1000000);
  c.gpus_per_node = r.integer(j, "gpus_per_node", 1, 4096);
  c.memory_gib = r.number(j, "gpu.memory_gib", 1e-3, 1e6);
  c.gpu_name = r.text(j, "gpu.name");
  if (const json* s = r.at(j, "sources"); s != nullptr) {
    if (!s->is_array() || s->empty()) r.fail("field 'sources' must be a non-empty list");
    for (const json& e : *s) c.sources.push_back(e.is_string() ? e.get<std::string>() : e.dump());
  }
  c.calibrated = j.contains("calibration");
  if (c.calibrated) {
    read_calibration(r, j, c);
    c.assumptions = "measured on this machine by troupe plan calibrate";
  } else {
    const std::vector<std::pair<Precision, std::string>> precisions = {{Precision::kBf16, "bf16"},
                                                                       {Precision::kFp16, "fp16"},
                                                                       {Precision::kTf32, "tf32"},
                                                                       {Precision::kFp32, "fp32"}};
    for (const auto& [p, key] : precisions) {
      c.peak_tflops[p] = r.number(j, "gpu.peak_tflops." + key, 1e-3, 1e6);
    }
    c.memory_gbytes_per_s = r.number(j, "gpu.memory_gbytes_per_s", 1e-3, 1e7);
    // NCCL moves data at a share of the link's rate (its protocol's overhead);
    // the file gives it where it is known.
    const double achieved = r.has(j, "intra_node.achieved_fraction")
                                ? r.number(j, "intra_node.achieved_fraction", 1e-3, 1)
                                : 1.0;
    c.intra = {
        .latency_s = r.number(j, "intra_node.latency_us", 0, 1e6) * 1e-6,
        .bytes_per_s = r.number(j, "intra_node.gbytes_per_s_per_gpu", 1e-3, 1e6) * 1e9 * achieved};
    c.nics_per_node = r.integer(j, "inter_node.nics_per_node", 1, 1024);
    const double nic = r.number(j, "inter_node.gbytes_per_s_per_nic", 1e-3, 1e6) * 1e9;
    // A GPU's share of its node's NICs (all GPUs talk across nodes at once).
    c.inter = {.latency_s = r.number(j, "inter_node.latency_us", 0, 1e6) * 1e-6,
               .bytes_per_s = nic * c.nics_per_node / c.gpus_per_node};
    c.gemm_max_efficiency = r.number(j, "efficiency.gemm_max", 1e-3, 1);
    c.gemm.m0 = r.number(j, "efficiency.gemm_half_m", 0, 1e6);
    c.gemm.n0 = r.number(j, "efficiency.gemm_half_n", 0, 1e6);
    c.gemm.k0 = r.number(j, "efficiency.gemm_half_k", 0, 1e6);
    if (r.has(j, "efficiency.gemm_launch_us")) {
      c.gemm.launch_s = r.number(j, "efficiency.gemm_launch_us", 0, 1e6) * 1e-6;
    }
    if (r.has(j, "gpu.sms")) c.gemm.sms = r.integer(j, "gpu.sms", 1, 100000);
    if (r.has(j, "efficiency.gemm_tile")) {
      c.gemm.tile_m = r.integer(j, "efficiency.gemm_tile.m", 1, 4096);
      c.gemm.tile_n = r.integer(j, "efficiency.gemm_tile.n", 1, 4096);
    }
    c.memory_efficiency = r.number(j, "efficiency.memory", 1e-3, 1);
    r.only(j, "",
           {"name", "description", "nodes", "gpus_per_node", "gpu", "intra_node", "inter_node",
            "efficiency", "sources"});
    r.only(j, "gpu", {"name", "peak_tflops", "memory_gib", "memory_gbytes_per_s", "sms"});
    r.only(j, "gpu.peak_tflops", {"bf16", "fp16", "tf32", "fp32"});
    r.only(j, "intra_node", {"link", "gbytes_per_s_per_gpu", "latency_us", "achieved_fraction"});
    r.only(j, "inter_node", {"link", "nics_per_node", "gbytes_per_s_per_nic", "latency_us"});
    r.only(j, "efficiency",
           {"gemm_tile", "gemm_max", "gemm_half_m", "gemm_half_n", "gemm_half_k", "gemm_launch_us",
            "memory", "note"});
    r.only(j, "efficiency.gemm_tile", {"m", "n"});
    c.assumptions = r.text(j, "efficiency.note");
  }
  if (!r.status().ok()) return r.status();
  return c;
}

absl::StatusOr<Cluster> load_cluster(const std::string& name_or_path) {
  for (const BuiltinCluster& b : builtin_clusters()) {
    if (name_or_path == b.name) return parse_cluster(b.json, absl::StrCat("cluster ", b.name));
  }
  std::string path = name_or_path;
  const bool this_machine = name_or_path == "this-machine";
  if (this_machine) path = this_machine_path();
  const bool looks_like_file = this_machine || name_or_path.find('/') != std::string::npos ||
                               name_or_path.ends_with(".json");
  if (!looks_like_file) {
    return absl::NotFoundError(absl::StrCat(
        "--cluster '", name_or_path, "': unknown; known: ", absl::StrJoin(cluster_names(), ", "),
        ", or a cluster file's path"));
  }
  std::ifstream in(path);
  if (!in) {
    if (this_machine) {
      return absl::NotFoundError(absl::StrCat("--cluster this-machine: ", path,
                                              " does not exist; run troupe plan calibrate first"));
    }
    return absl::NotFoundError(absl::StrCat("--cluster: cannot read ", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_cluster(ss.str(), path);
}

}  // namespace troupe::launcher::plan
