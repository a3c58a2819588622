// Fuzzes the planner's cluster files (launcher/plan/hardware.h): any bytes
// given as `troupe plan --cluster FILE.json`.
//
// Checks: a rejected file's error names the file; an accepted one has
// positive sizes, and every rank count and precision gives a device with
// finite, positive rates (or an error), and finite GEMM and message times.
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "fuzz/fuzz_util.h"
#include "launcher/plan/hardware.h"

using namespace troupe::launcher::plan;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = parse_cluster(text, "cluster.json");
  if (!c.ok()) {
    FUZZ_CHECK(absl::StartsWith(c.status().message(), "cluster.json"));
    return 0;
  }
  FUZZ_CHECK(c->nodes >= 1 && c->gpus_per_node >= 1 && c->memory_gib > 0);
  for (int ranks : {1, 2, 8, 1000}) {
    for (Precision p : {Precision::kBf16, Precision::kFp32}) {
      auto d = c->device(ranks, p);
      if (!d.ok()) continue;
      const double g = d->compute.gemm_seconds(1024, 768, 256, GemmPass::kBackward);
      const double m = d->compute.memory_seconds(1 << 20, "layernorm_fwd");
      const double l = d->intra.seconds(1 << 20) + d->inter.seconds(1 << 20);
      FUZZ_CHECK(std::isfinite(g) && g > 0 && std::isfinite(m) && m > 0 && std::isfinite(l));
      FUZZ_CHECK(d->memory_bytes > 0 && d->peak_flops > 0);
    }
  }
  return 0;
}
