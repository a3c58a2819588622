// fp32 host values to and from tensors of any compute dtype.
#include "gpu/host_values.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/device.h"
#include "gpu/precision.h"

namespace troupe::gpu {
namespace {

absl::Status check(const Tensor& t, std::size_t n, const char* what) {
  if (!t.defined() || t.device() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the tensor is undefined"));
  }
  if (!is_compute_dtype(t.dtype) || !t.is_contiguous() ||
      static_cast<std::size_t>(t.numel()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " values for ", t.describe()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status copy_values_to_device(std::span<const float> values, const Tensor& dst) {
  if (absl::Status st = check(dst, values.size(), "copy_values_to_device"); !st.ok()) return st;
  if (dst.dtype == DType::kF32) return dst.device()->copy_from_host(values.data(), dst);
  std::vector<std::uint16_t> bits(values.size());
  const bool bf16 = dst.dtype == DType::kBF16;
  for (std::size_t i = 0; i < values.size(); i++) {
    bits[i] = bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
  }
  return dst.device()->copy_from_host(bits.data(), dst);
}

absl::Status copy_values_to_host(const Tensor& src, std::span<float> values) {
  if (absl::Status st = check(src, values.size(), "copy_values_to_host"); !st.ok()) return st;
  if (src.dtype == DType::kF32) return src.device()->copy_to_host(src, values.data());
  std::vector<std::uint16_t> bits(values.size());
  if (absl::Status st = src.device()->copy_to_host(src, bits.data()); !st.ok()) return st;
  const bool bf16 = src.dtype == DType::kBF16;
  for (std::size_t i = 0; i < values.size(); i++) {
    values[i] = bf16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  }
  return absl::OkStatus();
}

}  // namespace troupe::gpu
