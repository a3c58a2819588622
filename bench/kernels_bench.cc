// Google Benchmarks of the CPU kernels at cpu-small's shapes (B=8, T=256,
// C=256, NH=4, V=50257), reporting GFLOP/s (or GB/s for memory-bound ops).
//   scripts/bench kernels
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <vector>

#include "gpu/cpu/cpu_kernels.h"

namespace {

namespace cpu = troupe::gpu::cpu;
using i64 = std::int64_t;
constexpr i64 B = 8, T = 256, C = 256, NH = 4, V = 50257, Vp = 50304, N = B * T;

std::vector<float> buf(i64 n, float v = 0.01f) {
  return std::vector<float>(static_cast<std::size_t>(n), v);
}

void flops(benchmark::State& s, double per_iter) {
  s.counters["GFLOP/s"] =
      benchmark::Counter(per_iter * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void bytes(benchmark::State& s, double per_iter) {
  s.counters["GB/s"] =
      benchmark::Counter(per_iter * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// (M, N, K): the step's linear layers and the LM head.
void BM_Sgemm(benchmark::State& s) {
  const i64 m = s.range(0), n = s.range(1), k = s.range(2);
  auto a = buf(m * k), b = buf(n * k), c = buf(m * n);
  for (auto _ : s) cpu::sgemm('N', 'T', m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  flops(s, 2.0 * m * n * k);
}
BENCHMARK(BM_Sgemm)
    ->Args({2048, 2048, 2048})
    ->Args({N, 3 * C, C})
    ->Args({N, 4 * C, C})
    ->Args({N, C, 4 * C})
    ->Args({N, Vp, C})
    ->UseRealTime();

// The same linear layers' forward in bf16 (oneDNN's bf16 matmul; skipped
// where it has only its reference loop): beside BM_Sgemm's fp32.
void BM_MatmulForwardBf16(benchmark::State& s) {
  if (!cpu::bf16_matmul_native()) {
    s.SkipWithError("oneDNN has no native bf16 matmul on this CPU");
    return;
  }
  const i64 m = s.range(0), n = s.range(1), k = s.range(2);
  std::vector<std::uint16_t> a(static_cast<std::size_t>(m * k), 0x3f00),
      b(static_cast<std::size_t>(n * k), 0x3e80), c(static_cast<std::size_t>(m * n));
  for (auto _ : s) cpu::matmul_forward_bf16(c.data(), a.data(), b.data(), nullptr, m, k, n);
  flops(s, 2.0 * m * n * k);
}
BENCHMARK(BM_MatmulForwardBf16)
    ->Args({2048, 2048, 2048})
    ->Args({N, 3 * C, C})
    ->Args({N, 4 * C, C})
    ->Args({N, C, 4 * C})
    ->Args({N, Vp, C})
    ->UseRealTime();

void BM_MatmulBackward(benchmark::State& s) {
  const i64 ic = s.range(0), oc = s.range(1);
  auto inp = buf(N * ic), w = buf(oc * ic), dout = buf(N * oc), dinp = buf(N * ic),
       dw = buf(oc * ic), db = buf(oc);
  for (auto _ : s)
    cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                         ic, oc, false);
  flops(s, 4.0 * N * ic * oc);
}
BENCHMARK(BM_MatmulBackward)->Args({C, 4 * C})->Args({C, Vp})->UseRealTime();

void BM_AttentionForward(benchmark::State& s) {
  auto qkv = buf(N * 3 * C), att = buf(B * NH * T * T), out = buf(N * C);
  for (auto _ : s) cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  flops(s, 2.0 * 2.0 * B * T * T * C);
}
BENCHMARK(BM_AttentionForward)->UseRealTime();

void BM_AttentionBackward(benchmark::State& s) {
  auto qkv = buf(N * 3 * C), att = buf(B * NH * T * T), datt = buf(B * NH * T * T),
       dout = buf(N * C), dqkv = buf(N * 3 * C);
  for (auto _ : s)
    cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                            NH);
  flops(s, 4.0 * 2.0 * B * T * T * C);
}
BENCHMARK(BM_AttentionBackward)->UseRealTime();

// The two attention kernel families side by side at 2048 tokens (B = 2048 /
// T) and T = 256 (cpu-small's), 1024 and 2048; GFLOP/s against the causal
// half of the score and value products (the reference kernel computes the
// whole T x T, the flash one skips the blocks above the diagonal).
void attention_pair(benchmark::State& s, bool flash, bool backward) {
  const i64 Ta = s.range(0), Ba = 2048 / Ta, Na = Ba * Ta;
  auto qkv = buf(Na * 3 * C), out = buf(Na * C), dout = buf(Na * C), dqkv = buf(Na * 3 * C);
  auto lse = buf(Ba * NH * Ta), delta = buf(Ba * NH * Ta);
  std::vector<float> att, datt;
  if (!flash) att = buf(Ba * NH * Ta * Ta), datt = buf(Ba * NH * Ta * Ta);
  for (auto _ : s) {
    if (flash) {
      cpu::flash_attention_forward(out.data(), lse.data(), qkv.data(), Ba, Ta, C, NH);
      if (backward) {
        cpu::flash_attention_backward(dqkv.data(), delta.data(), dout.data(), qkv.data(),
                                      out.data(), lse.data(), Ba, Ta, C, NH);
      }
    } else {
      cpu::attention_forward(out.data(), att.data(), qkv.data(), Ba, Ta, C, NH);
      if (backward) {
        cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), Ba,
                                Ta, C, NH);
      }
    }
  }
  flops(s, (backward ? 3.0 : 1.0) * 2.0 * Ba * Ta * Ta * C);
}
void BM_FlashAttentionForward(benchmark::State& s) { attention_pair(s, true, false); }
void BM_ReferenceAttentionForward(benchmark::State& s) { attention_pair(s, false, false); }
void BM_FlashAttentionForwardBackward(benchmark::State& s) { attention_pair(s, true, true); }
void BM_ReferenceAttentionForwardBackward(benchmark::State& s) { attention_pair(s, false, true); }
BENCHMARK(BM_FlashAttentionForward)->Arg(256)->Arg(1024)->Arg(2048)->UseRealTime();
BENCHMARK(BM_ReferenceAttentionForward)->Arg(256)->Arg(1024)->Arg(2048)->UseRealTime();
BENCHMARK(BM_FlashAttentionForwardBackward)->Arg(256)->Arg(1024)->Arg(2048)->UseRealTime();
BENCHMARK(BM_ReferenceAttentionForwardBackward)->Arg(256)->Arg(1024)->Arg(2048)->UseRealTime();

void BM_LayerNormForward(benchmark::State& s) {
  auto x = buf(N * C), out = buf(N * C), w = buf(C, 1.0f), b = buf(C), mean = buf(N), rstd = buf(N);
  for (auto _ : s)
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                           C);
  bytes(s, 2.0 * 4 * N * C);
}
BENCHMARK(BM_LayerNormForward)->UseRealTime();

void BM_LayerNormBackward(benchmark::State& s) {
  auto x = buf(N * C), dout = buf(N * C), dx = buf(N * C), w = buf(C, 1.0f), dw = buf(C),
       db = buf(C), mean = buf(N), rstd = buf(N, 1.0f);
  for (auto _ : s)
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), N, C);
  bytes(s, 3.0 * 4 * N * C);
}
BENCHMARK(BM_LayerNormBackward)->UseRealTime();

void BM_Gelu(benchmark::State& s) {
  auto x = buf(N * 4 * C), out = buf(N * 4 * C);
  for (auto _ : s) cpu::gelu_forward(out.data(), x.data(), troupe::gpu::DType::kF32, N * 4 * C);
  bytes(s, 2.0 * 4 * N * 4 * C);
}
BENCHMARK(BM_Gelu)->UseRealTime();

void BM_CrossEntropyForwardBackward(benchmark::State& s) {
  auto logits = buf(N * Vp), lse = buf(N), losses = buf(N);
  std::vector<std::int32_t> targets(N, 7);
  for (auto _ : s) {
    cpu::crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
    cpu::crossentropy_backward(logits.data(), logits.data(), lse.data(), targets.data(), 1e-4f, N,
                               V, Vp, 0);
  }
  bytes(s, 3.0 * 4 * N * Vp);
}
BENCHMARK(BM_CrossEntropyForwardBackward)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  omp_set_num_threads(2);  // as `scripts/bench` compares: 2 threads
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
