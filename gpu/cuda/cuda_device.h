// The CUDA backend's device: cudaStream_t streams, cudaEvent_t events,
// stream-ordered allocation and host callbacks, and every op of gpu/kernels.h
// (gpu/cuda/<op>.cu; GEMMs on cuBLASLt). Built only when the CUDA toolkit is
// present (TROUPE_HAVE_CUDA). Its contracts: gpu/cuda/cuda_stream.h.
//
//   absl::StatusOr<std::unique_ptr<gpu::Device>> dev = gpu::make_cuda_device(0);
//   if (!dev.ok()) ...  // Unavailable where no GPU is present
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace troupe::gpu {

// Number of CUDA devices visible to this process (0 where there is no GPU or
// no driver).
int cuda_device_count();

// Device `index`, or Unavailable naming the reason (no driver, no such GPU).
absl::StatusOr<std::unique_ptr<Device>> make_cuda_device(int index);

}  // namespace troupe::gpu
