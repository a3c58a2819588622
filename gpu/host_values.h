// fp32 values in host memory to and from a device tensor of any compute
// dtype (f32, bf16, f16), synchronously (Device::copy_from_host/to_host):
// for setup, weights and checkpoints, which hold fp32. Values written to a
// bf16/f16 tensor are rounded to nearest even; reading one back widens it
// exactly. Never from a host callback, as the copies they make.
//
//   std::vector<float> w = ...;                           // fp32 values
//   RETURN_IF_ERROR(gpu::copy_values_to_device(w, gpt.params()));   // bf16
#pragma once

#include <span>

#include "absl/status/status.h"
#include "gpu/tensor.h"

namespace troupe::gpu {

// InvalidArgument when the sizes differ or the dtype is not a compute dtype.
absl::Status copy_values_to_device(std::span<const float> values, const Tensor& dst);
absl::Status copy_values_to_host(const Tensor& src, std::span<float> values);

}  // namespace troupe::gpu
