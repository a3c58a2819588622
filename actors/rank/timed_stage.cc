// Model chunks of fixed cost (actors/rank/timed_stage.h).
#include "actors/rank/timed_stage.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace troupe::actors {

absl::StatusOr<std::vector<OpCost>> parse_op_costs(const std::string& text,
                                                   const std::string& flag) {
  std::vector<OpCost> out;
  for (const absl::string_view part : absl::StrSplit(text, ',')) {
    const std::string one(part);
    OpCost c;
    int used = -1;
    int n = std::sscanf(one.c_str(), "%lf:%lf:%lf%n", &c.f, &c.b, &c.w, &used);
    if (n != 3) {
      used = -1;
      n = std::sscanf(one.c_str(), "%lf:%lf%n", &c.f, &c.b, &used);
    }
    if (used != static_cast<int>(one.size())) n = 0;  // trailing text
    if (n == 2) {                                     // FWD:BWD, the backward split evenly
      c.w = c.b / 2;
      c.b = c.w;
    }
    const bool ok = (n == 2 || n == 3) && c.f >= 0 && c.b >= 0 && c.w >= 0 && c.f <= 1e5 &&
                    c.b <= 1e5 && c.w <= 1e5;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", text, ": expected F:B:W or FWD:BWD in milliseconds (>= 0), ",
                       "or a comma-separated list of one per pipeline stage"));
    }
    out.push_back(c);
  }
  return out;
}

namespace {
// The rank's tensor slice without its collectives: the chunk's parameters
// and gradients have the real layout, and no op of it communicates.
model::TensorParallel layout_only(const model::TpSlice& slice) {
  model::TensorParallel tp;
  tp.slice = slice;
  return tp;
}
}  // namespace

TimedStage::TimedStage(const StageRequest& r, const OpCost& cost, double jitter, std::uint64_t seed,
                       std::atomic<std::int64_t>* busy_ns)
    : GptStage(r.config, r.B, r.spec, r.slots, gpu::cpu_device(), layout_only(r.tp), {}, r.stashes),
      cost_(cost),
      jitter_(jitter),
      // Each chunk draws its own sequence (its first layer tells it apart).
      seed_(seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(r.spec.first_layer) + 1),
      busy_ns_(busy_ns) {
  gpu::check_invariant(gpt().init(1), "TimedStage");  // the CPU device
  for (int k = 0; k < r.slots; k++) std::memset(losses(k).host<float>(), 0, losses(k).nbytes());
}

double TimedStage::draw(Kind kind, std::int64_t k) const {
  const double base = kind == kF ? cost_.f : kind == kB ? cost_.b : cost_.w;
  if (jitter_ <= 0) return base;
  // SplitMix64 of (seed, kind, k): the same times on every run.
  std::uint64_t z = seed_ + (static_cast<std::uint64_t>(k) * 3 + kind + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * 0x1.0p-53 * 2 - 1;  // [-1, 1)
  return base * (1 + u * jitter_);
}

void TimedStage::forward(gpu::Stream& s, int, const gpu::Tensor&, const gpu::Tensor&) {
  sleep_on(s, draw(kF, count_[kF]++));
}

void TimedStage::backward(gpu::Stream& s, int, const gpu::Tensor&, const gpu::Tensor&, float,
                          const model::GradProgress& progress, bool) {
  const double b = draw(kB, count_[kB]++);
  const double w = draw(kW, count_[kW] / weight_pieces());
  count_[kW] += weight_pieces();
  sleep_on(s, b + w);
  points(0, weight_pieces(), progress);
}

void TimedStage::backward_input(gpu::Stream& s, int, int, const gpu::Tensor&, const gpu::Tensor&,
                                float, bool) {
  sleep_on(s, draw(kB, count_[kB]++));
}

void TimedStage::backward_weight(gpu::Stream& s, int, int first, int count,
                                 const model::GradProgress& progress) {
  const int n = weight_pieces(), last = count < 0 ? n : first + count;
  for (int p = first; p < last; p++) {
    sleep_on(s, draw(kW, count_[kW] / n) / n);
    count_[kW]++;
  }
  points(first, last, progress);
}

void TimedStage::points(int first, int last, const model::GradProgress& progress) const {
  if (!progress) return;
  using P = model::GradPoint::Part;
  const int n = weight_pieces();
  if (first == 0 && spec().head) progress({P::kHead, -1});
  for (int p = first; p < last && p < spec().layers(); p++) {
    progress({P::kLayer, spec().last_layer - 1 - p});
  }
  if (last == n && spec().embedding) progress({P::kEmbedding, -1});
}

void TimedStage::sleep_on(gpu::Stream& s, double ms) {
  if (ms <= 0) return;
  s.host_callback([ms, busy = busy_ns_] {
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_until(t0 +
                                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double, std::milli>(ms)));
    if (busy != nullptr) {
      *busy += std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - t0)
                   .count();
    }
  });
}

StageFactory timed_stage_factory(OpCosts costs, std::atomic<std::int64_t>* busy_ns) {
  return [costs = std::move(costs), busy_ns](const StageRequest& r) -> std::unique_ptr<GptStage> {
    return std::make_unique<TimedStage>(r, costs.of(r.stage), costs.jitter, costs.seed, busy_ns);
  };
}

}  // namespace troupe::actors
