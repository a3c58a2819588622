// Counter-based initialisation: a parameter element's initial value depends
// only on (seed, parameter name, element index in the unsharded tensor), so a
// tensor or pipeline shard initialises its slice alone and gets exactly the
// single-rank values, whatever the vocabulary padding.
//
// The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11) keyed by (seed, FNV-1a of the name), with the
// element index as counter; Box-Muller turns its first two words into N(0, 1).
//
//   std::uint64_t key = model::param_key(seed, "h.0.attn.c_attn.weight");
//   float w = 0.02f * model::counter_normal(key, row * C + col);
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "absl/strings/string_view.h"
#include "model/config.h"
#include "model/layout.h"

namespace troupe::model {

std::uint64_t param_key(std::uint64_t seed, absl::string_view name);
// A standard normal sample for (key, index), identical on every platform that
// has IEEE float and a correctly rounded libm log/cos/sqrt in double.
float counter_normal(std::uint64_t key, std::uint64_t index);

// Philox4x32-10 on one 128-bit counter.
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key);

// Initial values of elements [first, first + out.size()) of `spec` (row-major
// in the stored, unpadded-then-padded layout; padding rows get 0), GPT-2 style:
// N(0, std), residual projections N(0, std/sqrt(2L)) with std =
// config.init_std (0.02), LN weights 1, biases 0.
void init_values(const GptConfig& config, const ParamSpec& spec, std::uint64_t seed,
                 std::int64_t first, std::span<float> out);

}  // namespace troupe::model
