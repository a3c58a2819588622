// `troupe plan calibrate`: this machine's kernels, GEMM curve and message
// costs, measured (see launcher/plan/calibrate.h).
#include "launcher/plan/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/rank/rank.h"
#include "comm/inproc_transport.h"
#include "comm/ucx_transport.h"
#include "gpu/device.h"
#include "gpu/ops.h"
#include "gpu/tensor.h"

namespace troupe::launcher::plan {

using nlohmann::json;

GemmFit fit_gemm_curve(const std::vector<GemmPoint>& points, double flops_factor) {
  // e(M,N,K) = M/(M+m0) N/(N+n0) K/(K+k0); for each (m0, n0, k0) on the
  // grid the best log(peak) is the mean residual; keep the least squares.
  std::vector<double> grid{0};
  for (double g = 4; g <= 8192; g *= std::sqrt(2.0)) grid.push_back(g);
  GemmFit best;
  double best_err = INFINITY;
  const double n = static_cast<double>(points.size());
  for (double m0 : grid) {
    for (double n0 : grid) {
      for (double k0 : grid) {
        double sum = 0, sum2 = 0;
        for (const GemmPoint& p : points) {
          const double eff = p.M / (p.M + m0) * p.N / (p.N + n0) * p.K / (p.K + k0);
          // log(peak) = log(flops / (eff * seconds))
          const double r = std::log(flops_factor * p.M * p.N * p.K / (eff * p.seconds));
          sum += r;
          sum2 += r * r;
        }
        const double mean = sum / n, err = std::max(0.0, sum2 / n - mean * mean);
        if (err < best_err - 1e-12) {
          best_err = err;
          best = {std::exp(mean), m0, n0, k0, std::sqrt(err)};
        }
      }
    }
  }
  return best;
}

namespace {

using Clock = std::chrono::steady_clock;

// The fastest of `reps` runs of `op` enqueued on `s` (after a warm-up): on
// a shared machine noise only slows a kernel down.
double time_op(gpu::Stream& s, int reps, const std::function<void()>& op) {
  op();
  (void)s.synchronize();
  double best = INFINITY;
  for (int i = 0; i < reps; i++) {
    const auto t0 = Clock::now();
    op();
    (void)s.synchronize();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

gpu::Tensor filled(gpu::Stream& s, const gpu::Shape& shape, float value) {
  gpu::Tensor t = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kF32, shape);
  gpu::ops::fill(s, t, value);
  return t;
}

gpu::Tensor ids(std::int64_t n, int below) {
  gpu::Tensor t = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kI32, {n});
  std::vector<std::int32_t> host(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < host.size(); i++)
    host[i] = static_cast<std::int32_t>((i * 7919) % below);
  (void)gpu::cpu_device().copy_from_host(host.data(), t);
  return t;
}

json gemm_curve_json(const GemmFit& f) {
  return {{"peak_gflops", f.peak_flops / 1e9},
          {"m0", f.m0},
          {"n0", f.n0},
          {"k0", f.k0},
          {"rms_log_error", f.rms_log_error}};
}

// One thread count: GEMMs, attention and the memory-bound families.
json calibrate_threads(const CalibrateOptions& o, int threads, std::ostream& log) {
  gpu::Device& dev = gpu::cpu_device();
  std::unique_ptr<gpu::Stream> s = dev.make_stream({.threads = threads});
  const model::GptConfig& c = o.model;
  const std::int64_t B = o.micro_batch, T = c.T, C = c.C, N = B * T, NH = c.NH;
  const std::int64_t Vp = c.Vp();
  std::vector<GemmPoint> fwd, bwd;
  json points = json::array();
  for (int tp : {1, 2}) {
    if (NH % tp != 0) continue;
    // The runtime pads the vocabulary to a multiple of 128 x tp (and the
    // planner looks the LM head's GEMM up at that shape).
    const std::int64_t Vl = actors::ParallelOptions{{.tp = tp}}.sliced_config(c).Vp() / tp;
    const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
        {3 * C / tp, C}, {C, C / tp}, {4 * C / tp, C}, {C, 4 * C / tp}, {Vl, C}};
    for (auto [O, I] : shapes) {
      gpu::Tensor inp = filled(*s, {N, I}, 0.01f), w = filled(*s, {O, I}, 0.02f);
      gpu::Tensor out = filled(*s, {N, O}, 0), bias = filled(*s, {O}, 0);
      gpu::Tensor dinp = filled(*s, {N, I}, 0), dw = filled(*s, {O, I}, 0);
      const double tf =
          time_op(*s, o.reps, [&] { gpu::ops::matmul_forward(*s, out, inp, w, bias); });
      const double tb = time_op(*s, o.reps, [&] {
        gpu::ops::matmul_backward(*s, dinp, dw, bias, out, inp, w, gpu::Accumulate::kNo);
      });
      const double M = static_cast<double>(N), Nn = static_cast<double>(O),
                   K = static_cast<double>(I);
      fwd.push_back({M, Nn, K, tf});
      bwd.push_back({M, Nn, K, tb});
      points.push_back({{"M", M}, {"N", Nn}, {"K", K}, {"fwd_s", tf}, {"bwd_s", tb}});
    }
  }
  const GemmFit ff = fit_gemm_curve(fwd, 2), fb = fit_gemm_curve(bwd, 4);

  // Attention, both kernels (flash: troupe train's default on the CPU; the
  // reference one for --attention-kernel reference) at tp = 1 and 2: FLOP/s
  // against 4 B NH T^2 HS (x2 backward).
  double att_f = 0, att_b = 0, ref_f = 0, ref_b = 0, att_flops = 0;
  for (int tp : {1, 2}) {
    if (NH % tp != 0) continue;
    const std::int64_t NHl = NH / tp, Cl = C / tp;
    gpu::Tensor qkv = filled(*s, {B, T, 3 * Cl}, 0.01f), lse = filled(*s, {B, NHl, T}, 0);
    gpu::Tensor out = filled(*s, {B, T, Cl}, 0), dqkv = filled(*s, {B, T, 3 * Cl}, 0);
    gpu::Tensor dout = filled(*s, {B, T, Cl}, 0.01f), delta = filled(*s, {B, NHl, T}, 0);
    att_f += time_op(*s, o.reps, [&] { gpu::ops::flash_attention_forward(*s, out, lse, qkv); });
    att_b += time_op(*s, o.reps, [&] {
      gpu::ops::flash_attention_backward(*s, dqkv, delta, dout, qkv, out, lse);
    });
    gpu::Tensor att = filled(*s, {B, NHl, T, T}, 0), datt = filled(*s, {B, NHl, T, T}, 0);
    ref_f += time_op(*s, o.reps, [&] { gpu::ops::attention_forward(*s, out, att, qkv); });
    ref_b +=
        time_op(*s, o.reps, [&] { gpu::ops::attention_backward(*s, dqkv, datt, dout, qkv, att); });
    att_flops += 4.0 * static_cast<double>(B * NHl * T * T * c.HS());
  }

  // Memory-bound families, bytes as launcher/plan/cost.cc counts them.
  json families = json::object();
  auto family = [&](const char* name, double bytes, const std::function<void()>& op) {
    families[name] = bytes / time_op(*s, o.reps, op) / 1e9;
  };
  const double f4 = 4;
  {
    gpu::Tensor x = filled(*s, {N, C}, 0.5f), y = filled(*s, {N, C}, 0),
                dy = filled(*s, {N, C}, 0.1f);
    gpu::Tensor w = filled(*s, {C}, 1), b = filled(*s, {C}, 0), mean = filled(*s, {N}, 0),
                rstd = filled(*s, {N}, 0), dw = filled(*s, {C}, 0), db = filled(*s, {C}, 0);
    family("layernorm_fwd", 2 * N * C * f4 + 8 * N,
           [&] { gpu::ops::layernorm_forward(*s, y, mean, rstd, x, w, b); });
    family("layernorm_bwd", 4 * N * C * f4 + 8 * N,
           [&] { gpu::ops::layernorm_backward(*s, x, dw, db, dy, y, w, mean, rstd); });
    family("residual", 3 * N * C * f4, [&] { gpu::ops::residual_forward(*s, y, x, dy); });
    family("axpy", 3 * N * C * f4, [&] { gpu::ops::axpy(*s, y, 0.5f, x); });
    family("fill", N * C * f4, [&] { gpu::ops::fill(*s, y, 0); });
    gpu::Tensor tokens = ids(N, c.V), wte = filled(*s, {Vp, C}, 0.01f),
                wpe = filled(*s, {T, C}, 0.01f);
    gpu::Tensor e = filled(*s, {B, T, C}, 0);
    gpu::Tensor tok2 = tokens.reshape({B, T});
    family("embedding_fwd", 3 * N * C * f4,
           [&] { gpu::ops::embedding_forward(*s, e, tok2, wte, wpe); });
    family("embedding_bwd", 4 * N * C * f4,
           [&] { gpu::ops::embedding_backward(*s, wte, wpe, e, tok2); });
  }
  {
    gpu::Tensor h = filled(*s, {N, 4 * C}, 0.3f), g = filled(*s, {N, 4 * C}, 0),
                d = filled(*s, {N, 4 * C}, 0.1f);
    family("gelu_fwd", 2 * N * 4 * C * f4, [&] { gpu::ops::gelu_forward(*s, g, h); });
    family("gelu_bwd", 3 * N * 4 * C * f4, [&] { gpu::ops::gelu_backward(*s, d, h, g); });
  }
  {
    gpu::Tensor logits = filled(*s, {N, Vp}, 0.01f), losses = filled(*s, {N}, 0),
                lse = filled(*s, {N}, 0);
    gpu::Tensor targets = ids(N, c.V);
    family("crossentropy_fwd", N * Vp * f4,
           [&] { gpu::ops::crossentropy_forward(*s, losses, lse, logits, targets, c.V); });
    // Vocab-parallel (tp 2): each rank's max, sum-exp and target over its half.
    gpu::Tensor half = logits.view(0, {N, Vp / 2}), stats = filled(*s, {N, 3}, 0);
    family("crossentropy_partial", N * (Vp / 2) * f4, [&] {
      gpu::ops::crossentropy_partial(*s, stats, half, targets, c.V, {.begin = 0, .total = c.V});
    });
    family("crossentropy_bwd", 2 * N * Vp * f4,
           [&] { gpu::ops::crossentropy_backward(*s, logits, logits, lse, targets, 1e-6f, c.V); });
  }
  {
    // The optimizer's ops over a model-sized buffer (the head's weights).
    const std::int64_t n = Vp * C;
    gpu::Tensor p = filled(*s, {n}, 0.01f), g = filled(*s, {n}, 0.001f), m = filled(*s, {n}, 0),
                v = filled(*s, {n}, 0);
    gpu::Tensor norm = gpu::Tensor::empty(dev, gpu::DType::kF64, {1});
    family("adamw", 28.0 * n, [&] { gpu::ops::adamw(*s, p, g, m, v, {.lr = 1e-4f}); });
    family("norm", 4.0 * n, [&] { gpu::ops::squared_norm(*s, norm, g); });
  }
  double sum = 0;
  for (auto& [k, v] : families.items()) sum += v.get<double>();
  log << absl::StrFormat(
      "  %d thread%s: GEMM fwd %.1f GFLOP/s peak (m0 %.0f n0 %.0f k0 %.0f, fit %.1f%%), bwd "
      "%.1f; attention %.1f/%.1f GFLOP/s (reference kernel %.1f/%.1f); memory-bound %.1f GB/s "
      "on average\n",
      threads, threads == 1 ? "" : "s", ff.peak_flops / 1e9, ff.m0, ff.n0, ff.k0,
      100 * ff.rms_log_error, fb.peak_flops / 1e9, att_flops / att_f / 1e9,
      2 * att_flops / att_b / 1e9, att_flops / ref_f / 1e9, 2 * att_flops / ref_b / 1e9,
      sum / static_cast<double>(families.size()));
  return {{"threads", threads},
          {"gemm_fwd", gemm_curve_json(ff)},
          {"gemm_bwd", gemm_curve_json(fb)},
          {"attention_fwd_gflops", att_flops / att_f / 1e9},
          {"attention_bwd_gflops", 2 * att_flops / att_b / 1e9},
          {"reference_attention_fwd_gflops", att_flops / ref_f / 1e9},
          {"reference_attention_bwd_gflops", 2 * att_flops / ref_b / 1e9},
          {"memory_gbytes_per_s", sum / static_cast<double>(families.size())},
          {"family_gbytes_per_s", families},
          {"gemm_points", points}};
}

// One-way time of a message of `bytes` between two transports (ping-pong / 2).
absl::StatusOr<double> one_way(comm::Transport& a, comm::Transport& b, std::size_t bytes,
                               int reps) {
  std::vector<char> x(bytes, 1), y(bytes, 0);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  absl::Status failure;
  auto cb = [&](absl::Status st) {
    std::lock_guard<std::mutex> lock(mu);
    if (!st.ok() && failure.ok()) failure = st;
    done++;
    cv.notify_all();
  };
  auto wait = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return done >= n; });
  };
  std::vector<double> t;
  for (int i = 0; i < reps + 1; i++) {
    done = 0;
    const auto t0 = Clock::now();
    const comm::Tag tag = static_cast<comm::Tag>(2 * i + 1);
    b.recv(0, tag, y.data(), bytes, cb);
    a.send(1, tag, x.data(), bytes, cb);
    a.recv(1, tag + 1, x.data(), bytes, cb);
    if (!wait(2)) return absl::DeadlineExceededError("calibrate: a message took over 30 s");
    b.send(0, tag + 1, y.data(), bytes, cb);
    if (!wait(4)) return absl::DeadlineExceededError("calibrate: a message took over 30 s");
    if (!failure.ok()) return failure;
    if (i > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

absl::StatusOr<json> link_json(comm::Transport& a, comm::Transport& b) {
  absl::StatusOr<double> small = one_way(a, b, 8, 200);
  if (!small.ok()) return small.status();
  const std::size_t big_bytes = std::size_t{16} << 20;
  absl::StatusOr<double> big = one_way(a, b, big_bytes, 5);
  if (!big.ok()) return big.status();
  const double bw = static_cast<double>(big_bytes) / std::max(1e-9, *big - *small);
  return json{{"latency_us", *small * 1e6}, {"gbytes_per_s", bw / 1e9}};
}

}  // namespace

absl::StatusOr<std::string> calibrate(const CalibrateOptions& o, std::ostream& log) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<int> threads = o.threads;
  if (threads.empty()) {
    for (int k = 1; k < cores; k *= 2) threads.push_back(k);
    threads.push_back(cores);
  }
  log << "calibrating " << o.model.name << " shapes (B=" << o.micro_batch << ", T=" << o.model.T
      << ") on " << cores << " cores\n";
  json by_threads = json::array();
  for (int k : threads) by_threads.push_back(calibrate_threads(o, k, log));

  auto fabric = std::make_shared<comm::InProcFabric>(2);
  std::unique_ptr<comm::Transport> a = fabric->endpoint(0), b = fabric->endpoint(1);
  absl::StatusOr<json> inproc = link_json(*a, *b);
  if (!inproc.ok()) return inproc.status();
  // As troupe launch runs ranks on one host.
  auto u0 = comm::UcxTransport::create(0, 2, {.one_host = true});
  if (!u0.ok()) return u0.status();
  auto u1 = comm::UcxTransport::create(1, 2, {.one_host = true});
  if (!u1.ok()) return u1.status();
  const std::vector<std::string> addresses = {(*u0)->address(), (*u1)->address()};
  if (absl::Status st = (*u0)->connect(addresses); !st.ok()) return st;
  if (absl::Status st = (*u1)->connect(addresses); !st.ok()) return st;
  absl::StatusOr<json> ucx = link_json(**u0, **u1);
  if (!ucx.ok()) return ucx.status();
  log << absl::StrFormat("  messages: in-process %.1f us + %.2f GB/s; UCX %.1f us + %.2f GB/s\n",
                         (*inproc)["latency_us"].get<double>(),
                         (*inproc)["gbytes_per_s"].get<double>(),
                         (*ucx)["latency_us"].get<double>(), (*ucx)["gbytes_per_s"].get<double>());

  char host[256] = {};
  (void)gethostname(host, sizeof host - 1);
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  json j = {
      {"name", "this-machine"},
      {"description", absl::StrCat("measured by troupe plan calibrate on ", host, " (", cpu,
                                   "): a GPU is a rank with its share of the ", cores, " cores")},
      {"measured_unix_time", static_cast<long long>(now)},
      {"nodes", 1},
      {"gpus_per_node", cores},
      {"cores", cores},
      {"gpu", {{"name", absl::StrCat("a rank on ", cpu)}, {"memory_gib", ram / (1 << 30)}}},
      {"calibration",
       {{"model", o.model.name},
        {"micro_batch", o.micro_batch},
        {"seq_len", o.model.T},
        {"threads", by_threads},
        {"inproc", *inproc},
        {"ucx", *ucx}}},
      {"sources",
       {"troupe plan calibrate: troupe's own CPU kernels timed at the model's shapes (the fastest "
        "of --reps runs after a warm-up), the GEMM curve fitted to them, messages by ping-pong"}}};
  return j.dump(2) + "\n";
}

}  // namespace troupe::launcher::plan
