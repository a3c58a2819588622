// Philox4x32-10, Box-Muller and GPT-2 initialisation.
#include "model/init.h"

#include <cmath>
#include <numbers>

namespace troupe::model {

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> ctr,
                                        std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; round++) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * ctr[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * ctr[2];
    ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return ctr;
}

std::uint64_t param_key(std::uint64_t seed, absl::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h ^ (seed * 0x9E3779B97F4A7C15ull);
}

float counter_normal(std::uint64_t key, std::uint64_t index) {
  auto r = philox4x32(
      {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), 0u, 0u},
      {static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32)});
  // Uniforms in (0, 1] and [0, 1) with 32 bits each.
  const double u1 = (static_cast<double>(r[0]) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(r[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

void init_values(const GptConfig& config, const ParamSpec& spec, std::uint64_t seed,
                 std::int64_t first, std::span<float> out) {
  // In the unsliced tensor: a TP slice's element i is element global_index(i).
  const std::int64_t row_len = gpu::shape_numel(spec.full_shape) / spec.full_shape[0];
  const std::int64_t real = spec.real_rows * row_len;  // elements that exist unpadded
  float std_dev = static_cast<float>(config.init_std);
  if (spec.init == Init::kNormalScaled) {
    std_dev = static_cast<float>(config.init_std / std::sqrt(2.0 * config.L));
  }
  const std::uint64_t key = param_key(seed, spec.name);
  for (std::size_t i = 0; i < out.size(); i++) {
    const std::int64_t e = spec.global_index(first + static_cast<std::int64_t>(i));
    switch (spec.init) {
      case Init::kZeros:
        out[i] = 0.0f;
        break;
      case Init::kOnes:
        out[i] = 1.0f;
        break;
      case Init::kNormal:
      case Init::kNormalScaled:
        out[i] = e < real ? std_dev * counter_normal(key, static_cast<std::uint64_t>(e)) : 0.0f;
        break;
    }
  }
}

}  // namespace troupe::model
