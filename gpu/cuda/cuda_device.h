// The CUDA backend's device: cudaStream_t streams, cudaEvent_t events,
// stream-ordered allocation and host callbacks, and every op of gpu/kernels.h
// (gpu/cuda/<op>.cu; GEMMs on cuBLASLt). Built only when the CUDA toolkit is
// present (TROUPE_HAVE_CUDA). Its contracts: gpu/cuda/cuda_stream.h.
//
//   absl::StatusOr<std::unique_ptr<gpu::Device>> dev = gpu::make_cuda_device(0);
//   if (!dev.ok()) ...  // Unavailable where no GPU is present
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace troupe::gpu {

// Number of CUDA devices visible to this process (0 where there is no GPU or
// no driver).
int cuda_device_count();

// "" where every visible GPU has a compute capability this build has
// kernels for (8.0 and newer: sm_80 and sm_90 code, and their PTX for newer
// GPUs), else which one does not ("cuda:1 (Tesla T4) is compute capability
// 7.5; troupe's kernels need 8.0 or newer").
std::string cuda_unsupported_device();

// Device `index`, or Unavailable naming the reason (no driver, no such GPU,
// one older than compute capability 8.0).
absl::StatusOr<std::unique_ptr<Device>> make_cuda_device(int index);

}  // namespace troupe::gpu
