// troupe's CUDA ops at gpt2-124m's shapes (B 8, T 1024, C 768, 12 heads, a
// vocabulary of 50257 padded to 50304): the milliseconds per call of each op,
// one JSON object per line. Activations and parameters in --dtype (bf16 by
// default, as --bf16 trains; f32), the parameter gradients, LayerNorm
// statistics, losses and AdamW's tensors in fp32, as the model keeps them.
// bench/gpu_ops_torch.py times the same ops in PyTorch on the same GPU in
// the same dtype; scripts/gpu-check runs both and reports the ratios. Needs
// a GPU (exit 2 without one).
//   build/bench/gpu_ops_bench [--reps N] [--dtype bf16|f32]
//   build/bench/gpu_ops_bench --gemm-sweep [--reps N]
//     instead: troupe's GEMM (ops::matmul_forward, bf16, no bias) at every
//     M, N, K of 256 to 4096 (powers of two, 125 shapes) and at the planner's
//     validation shapes, as bench/data/xla_sm90_bf16_matmul.csv's rows
//     ("m,n,k,flops_per_s") and a last "# complete: N rows", which
//     bench/gemm_fit.py --data fits.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_device.h"
#include "gpu/ops.h"

namespace {

using troupe::gpu::Tensor;
namespace gpu = troupe::gpu;
namespace ops = troupe::gpu::ops;
using i64 = std::int64_t;

constexpr i64 B = 8, T = 1024, C = 768, NH = 12, V = 50257, Vp = 50304, N = B * T, L = 12;

struct Bench {
  gpu::Device& dev;
  gpu::Stream& s;
  int reps;
  gpu::DType dtype;  // of the activations and the parameters' compute copy

  // N(0, scale^2) values in fp32 (rnd32) or the compute dtype (rnd).
  Tensor rnd32(const gpu::Shape& shape, float scale = 0.02f) {
    Tensor h = Tensor::empty(gpu::cpu_device(), gpu::DType::kF32, shape);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, scale);
    for (i64 i = 0; i < h.numel(); i++) h.data<float>()[i] = d(rng);
    Tensor t = Tensor::empty(dev, gpu::DType::kF32, shape);
    if (!dev.copy_from_host(h.raw(), t).ok()) std::exit(1);
    return t;
  }
  Tensor rnd(const gpu::Shape& shape, float scale = 0.02f) {
    Tensor f = rnd32(shape, scale);
    if (dtype == gpu::DType::kF32) return f;
    Tensor t = Tensor::empty(dev, dtype, shape);
    ops::convert(s, t, f);
    if (!s.synchronize().ok()) std::exit(1);
    return t;
  }
  Tensor ids(const gpu::Shape& shape) {
    Tensor h = Tensor::empty(gpu::cpu_device(), gpu::DType::kI32, shape);
    std::mt19937 rng(2);
    for (i64 i = 0; i < h.numel(); i++) h.data<std::int32_t>()[i] = static_cast<int>(rng() % V);
    Tensor t = Tensor::empty(dev, gpu::DType::kI32, shape);
    if (!dev.copy_from_host(h.raw(), t).ok()) std::exit(1);
    return t;
  }

  // An op's error as a JSON line (quotes and backslashes replaced), then exit 1.
  [[noreturn]] static void fail(const char* name, const absl::Status& st) {
    std::string msg(st.message());
    for (char& c : msg) {
      if (c == '"' || c == '\\' || c < ' ') c = '\'';
    }
    std::printf("{\"op\": \"%s\", \"error\": \"%s\"}\n", name, msg.c_str());
    std::exit(1);
  }

  // Milliseconds per call: 3 warm-up calls, then `reps` calls between two
  // synchronisations.
  void time(const char* name, double flop, const std::function<void()>& op) {
    for (int i = 0; i < 3; i++) op();
    if (absl::Status st = s.synchronize(); !st.ok()) fail(name, st);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; i++) op();
    absl::Status st = s.synchronize();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        reps;
    if (!st.ok()) fail(name, st);
    std::printf("{\"op\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f}\n", name, ms,
                flop > 0 ? flop / ms * 1e-9 : 0.0);
    std::fflush(stdout);
  }
};

// The GEMM sweep: each shape's FLOP/s, the best of three timings of `reps`
// calls (wall clock between two synchronisations: the kernel with its
// launch, as a training step runs it). The operands are views of one device
// pool filled with copies of a small random block (drawing every element on
// the host took most of a minute); a last line counts the rows, so a sweep
// cut short is not taken for a whole one (bench/gemm_fit.py checks it).
int gemm_sweep(gpu::Device& dev, gpu::Stream& s, int reps) {
  Bench b{dev, s, reps, gpu::DType::kBF16};
  std::vector<std::array<i64, 3>> shapes;
  for (i64 m = 256; m <= 4096; m *= 2) {
    for (i64 n = 256; n <= 4096; n *= 2) {
      for (i64 k = 256; k <= 4096; k *= 2) shapes.push_back({m, n, k});
    }
  }
  // tp 8 slices of the published runs' layers (hidden 6144 to 25600, 2048
  // or 8192 tokens a micro-batch): qkv, projection, fc, fc-proj.
  for (const i64 tokens : {2048, 8192}) {
    for (const i64 c : {6144, 12288, 20480, 25600}) {
      for (const std::array<i64, 2> nk :
           {std::array<i64, 2>{3 * c / 8, c}, {c, c / 8}, {c / 2, c}, {c, c / 2}}) {
        shapes.push_back({tokens, nk[0], nk[1]});
      }
    }
  }
  i64 in = 0, wt = 0, outs = 0;
  for (const auto& [m, n, k] : shapes) {
    in = std::max(in, m * k);
    wt = std::max(wt, n * k);
    outs = std::max(outs, m * n);
  }
  constexpr i64 kBlock = i64{1} << 22;
  const Tensor block = b.rnd({kBlock}, 1.0f);
  const Tensor pool = Tensor::empty(dev, b.dtype, {in + wt});
  for (i64 at = 0; at < in + wt; at += kBlock) {
    const i64 len = std::min(kBlock, in + wt - at);
    ops::copy(s, pool.view(at, {len}), block.view(0, {len}));
  }
  const Tensor out_pool = Tensor::empty(dev, b.dtype, {outs});
  std::printf("m,n,k,flops_per_s\n");
  for (const auto& [m, n, k] : shapes) {
    const Tensor x = pool.view(0, {m, k}), w = pool.view(in, {n, k});
    const Tensor out = out_pool.view(0, {m, n});
    double best = 1e30;
    for (int t = 0; t < 3; t++) {
      for (int i = 0; i < 3; i++) ops::matmul_forward(s, out, x, w, Tensor{});
      if (absl::Status st = s.synchronize(); !st.ok()) Bench::fail("gemm_sweep", st);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < b.reps; i++) ops::matmul_forward(s, out, x, w, Tensor{});
      if (absl::Status st = s.synchronize(); !st.ok()) Bench::fail("gemm_sweep", st);
      best = std::min(
          best,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / b.reps);
    }
    std::printf("%lld,%lld,%lld,%.0f\n", static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k), 2.0 * m * n * k / best);
    std::fflush(stdout);
  }
  std::printf("# complete: %zu rows\n", shapes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool sweep = false;
  gpu::DType dtype = gpu::DType::kBF16;
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--gemm-sweep") == 0) sweep = true;
  }
  for (int i = 1; i + 1 < argc; i++) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--dtype") == 0) {
      if (std::strcmp(argv[i + 1], "f32") == 0) {
        dtype = gpu::DType::kF32;
      } else if (std::strcmp(argv[i + 1], "bf16") != 0) {
        std::fprintf(stderr, "gpu_ops_bench: --dtype %s: use bf16 or f32\n", argv[i + 1]);
        return 2;
      }
    }
  }
  auto dev = gpu::make_cuda_device(0);
  if (!dev.ok()) {
    std::fprintf(stderr, "gpu_ops_bench: %s\n", std::string(dev.status().message()).c_str());
    return 2;
  }
  std::unique_ptr<gpu::Stream> s = (*dev)->make_stream({});
  if (sweep) return gemm_sweep(**dev, *s, reps);
  Bench b{**dev, *s, reps, dtype};
  const Tensor tokens = b.ids({B, T}), targets = b.ids({N});
  const Tensor wte = b.rnd({Vp, C}), wpe = b.rnd({T, C}), x = b.rnd({N, C}, 1.0f);
  const Tensor lnw = b.rnd({C}), lnb = b.rnd({C}), mean = b.rnd32({N}), rstd = b.rnd32({N});
  const Tensor y = b.rnd({N, C}), qkv = b.rnd({B, T, 3 * C}, 1.0f), att = b.rnd({B, NH, T, T});
  const Tensor h = b.rnd({N, 4 * C}, 1.0f), g = b.rnd({N, 4 * C});
  const Tensor wqkv = b.rnd({3 * C, C}), bqkv = b.rnd({3 * C}), w4 = b.rnd({4 * C, C});
  const Tensor b4 = b.rnd({4 * C}), wp = b.rnd({C, 4 * C}), bp = b.rnd({C});
  const Tensor logits = b.rnd({N, Vp}, 1.0f), losses = b.rnd32({N}), lse = b.rnd32({N});
  const Tensor dqkv = b.rnd({B, T, 3 * C}), datt = b.rnd({B, NH, T, T});
  // (dw4, db4: the fp32 main gradients the weight-gradient GEMM adds into.)
  const Tensor dx = b.rnd({N, C}), dw4 = b.rnd32({4 * C, C}), db4 = b.rnd32({4 * C});
  const Tensor norm = Tensor::empty(**dev, gpu::DType::kF64, {1});
  const double bt = static_cast<double>(N);

  b.time("embedding_forward", 0, [&] {
    ops::embedding_forward(*s, y.reshape({B, T, C}), tokens, wte, wpe);
  });
  b.time("layernorm_forward", 0, [&] { ops::layernorm_forward(*s, y, mean, rstd, x, lnw, lnb); });
  b.time("matmul_forward_qkv", 2 * bt * C * 3 * C, [&] {
    ops::matmul_forward(*s, qkv.reshape({N, 3 * C}), x, wqkv, bqkv);
  });
  b.time("matmul_forward_fc", 2 * bt * C * 4 * C, [&] { ops::matmul_forward(*s, h, x, w4, b4); });
  b.time("matmul_forward_proj", 2 * bt * C * 4 * C, [&] { ops::matmul_forward(*s, y, g, wp, bp); });
  b.time("matmul_forward_lm_head", 2 * bt * C * Vp,
         [&] { ops::matmul_forward(*s, logits, x, wte, Tensor{}); });
  b.time("matmul_backward_fc", 4 * bt * C * 4 * C,
         [&] { ops::matmul_backward(*s, dx, dw4, db4, g, x, w4, gpu::Accumulate::kNo); });
  b.time("gelu_forward", 0, [&] { ops::gelu_forward(*s, g, h); });
  // The MLP's fused pair: fc with its GELU (pre kept), and proj's backward
  // through GELU with fc's bias gradient (dh, dwp, dbp: its outputs).
  const Tensor dh = b.rnd({N, 4 * C}), dwp = b.rnd32({C, 4 * C}), dbp = b.rnd32({C});
  b.time("matmul_gelu_forward_fc", 2 * bt * C * 4 * C,
         [&] { ops::matmul_gelu_forward(*s, g, h, x, w4, b4); });
  b.time("matmul_backward_gelu_proj", 4 * bt * C * 4 * C,
         [&] { ops::matmul_backward_gelu(*s, dh, db4, dwp, dbp, dx, g, wp, h); });
  b.time("attention_forward", 4.0 * B * T * T * C / 2, [&] {
    ops::attention_forward(*s, y.reshape({B, T, C}), att, qkv);
  });
  b.time("attention_backward", 8.0 * B * T * T * C / 2, [&] {
    ops::attention_backward(*s, dqkv, datt, y.reshape({B, T, C}), qkv, att);
  });
  b.time("crossentropy_forward", 0,
         [&] { ops::crossentropy_forward(*s, losses, lse, logits, targets, static_cast<int>(V)); });
  b.time("residual_forward", 0, [&] { ops::residual_forward(*s, y, x, dx); });
  const Tensor gwte = b.rnd32({Vp, C});  // a main gradient: the norm is of those
  b.time("squared_norm_wte", 0, [&] { ops::squared_norm(*s, norm, gwte); });

  // AdamW over gpt2-124m's 148 tensors, one multi-tensor op.
  std::vector<gpu::AdamWTensor> params;
  // (In bf16: the fp32 master's bf16 compute copy written by the step, as
  // the trainer's.)
  auto add = [&](const gpu::Shape& shape) {
    const Tensor copy = dtype == gpu::DType::kF32 ? Tensor{} : Tensor::empty(**dev, dtype, shape);
    params.push_back(
        {b.rnd32(shape), b.rnd32(shape), b.rnd32(shape, 0.0f), b.rnd32(shape, 0.0f), 0.1f, copy});
  };
  add({Vp, C});
  add({T, C});
  for (int l = 0; l < L; l++) {
    for (const gpu::Shape& shape :
         {gpu::Shape{C}, gpu::Shape{C}, gpu::Shape{3 * C, C}, gpu::Shape{3 * C}, gpu::Shape{C, C},
          gpu::Shape{C}, gpu::Shape{C}, gpu::Shape{C}, gpu::Shape{4 * C, C}, gpu::Shape{4 * C},
          gpu::Shape{C, 4 * C}, gpu::Shape{C}}) {
      add(shape);
    }
  }
  add({C});
  add({C});
  gpu::AdamWArgs a;
  a.lr = 1e-4f;
  b.time("adamw_many_gpt2_124m", 0, [&] { ops::adamw_many(*s, params, a); });
  // (Last: a slow kernel here must not cost the ops above their times.)
  // Flash attention at the shapes (B·T = 8192 tokens; head size 64
  // with 12 heads, 128 with 16), forward and forward + backward, FLOPs as
  // the causal half of 4·B·NH·T²·HS (x2.5 with the backward's, as
  // FlashAttention's benchmarks count them); gpu_ops_torch.py times
  // PyTorch's SDPA under the same names.
  // (5 calls each: the CUDA-core backward at T 8192 takes a while.)
  const int op_reps = b.reps;
  b.reps = 5;
  for (const std::int64_t Ta : {1024, 4096, 8192}) {
    for (const std::int64_t hs : {64, 128}) {
      const std::int64_t Ba = 8192 / Ta, NHa = hs == 64 ? 12 : 16, Ca = NHa * hs;
      const Tensor aqkv = b.rnd({Ba, Ta, 3 * Ca}, 1.0f), ay = b.rnd({Ba, Ta, Ca});
      const Tensor ady = b.rnd({Ba, Ta, Ca}), adqkv = b.rnd({Ba, Ta, 3 * Ca});
      const Tensor alse = b.rnd32({Ba, NHa, Ta}), adelta = b.rnd32({Ba, NHa, Ta});
      const double fwd = 4.0 * Ba * NHa * Ta * Ta * hs / 2;
      const std::string name = absl::StrCat("T", Ta, "_hs", hs);
      b.time(absl::StrCat("attention_fwd_", name).c_str(), fwd,
             [&] { ops::flash_attention_forward(*s, ay, alse, aqkv); });
      b.time(absl::StrCat("attention_fwdbwd_", name).c_str(), 3.5 * fwd, [&] {
        ops::flash_attention_forward(*s, ay, alse, aqkv);
        ops::flash_attention_backward(*s, adqkv, adelta, ady, aqkv, ay, alse);
      });
    }
  }
  b.reps = op_reps;
  return 0;
}
