// Model chunks of fixed cost (actors/rank/timed_stage.h).
#include "actors/rank/timed_stage.h"

#include <chrono>
#include <cstring>
#include <thread>

namespace troupe::actors {

TimedStage::TimedStage(const model::GptConfig& c, int B, const model::StageSpec& spec, int slots,
                       double fwd_ms, double bwd_ms, std::atomic<std::int64_t>* busy_ns)
    : GptStage(c, B, spec, slots, gpu::cpu_device()),
      fwd_ms_(fwd_ms),
      bwd_ms_(bwd_ms),
      busy_ns_(busy_ns) {
  gpu::check_invariant(gpt().init(1), "TimedStage");  // the CPU device
  for (int k = 0; k < slots; k++) std::memset(losses(k).host<float>(), 0, losses(k).nbytes());
}

void TimedStage::forward(gpu::Stream& s, int, const gpu::Tensor&, const gpu::Tensor&) {
  sleep_on(s, fwd_ms_);
}

void TimedStage::backward(gpu::Stream& s, int, const gpu::Tensor&, const gpu::Tensor&, float,
                          const model::GradProgress& progress) {
  sleep_on(s, bwd_ms_);
  if (!progress) return;
  using P = model::GradPoint::Part;
  if (spec().head) progress({P::kHead, -1});
  for (int l = spec().last_layer - 1; l >= spec().first_layer; l--) progress({P::kLayer, l});
  if (spec().embedding) progress({P::kEmbedding, -1});
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

StageFactory timed_stage_factory(double fwd_ms, double bwd_ms, std::atomic<std::int64_t>* busy_ns) {
  return [=](const model::GptConfig& c, int B, const model::StageSpec& spec,
             int slots) -> std::unique_ptr<GptStage> {
    return std::make_unique<TimedStage>(c, B, spec, slots, fwd_ms, bwd_ms, busy_ns);
  };
}

}  // namespace troupe::actors
