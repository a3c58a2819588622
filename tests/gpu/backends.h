// The backends a test can run on: "cpu" always, and "opaque" (the CPU device
// whose memory the host may not read); "cuda" where the CUDA backend is
// built and a GPU is visible (null otherwise, and the test skips saying so).
#pragma once

#include <memory>
#include <string>

#include "gpu/device.h"
#ifdef TROUPE_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace troupe::testing {

inline gpu::Device* backend(const std::string& name) {
  if (name == "cpu") return &gpu::cpu_device();
  if (name == "opaque") {  // the CPU's kernels, memory the host may not read
    static std::unique_ptr<gpu::Device> opaque = gpu::make_opaque_cpu_device();
    return opaque.get();
  }
#ifdef TROUPE_HAVE_CUDA
  static std::unique_ptr<gpu::Device> cuda = [] {
    auto d = gpu::make_cuda_device(0);
    return d.ok() ? std::move(*d) : nullptr;
  }();
  return cuda.get();
#else
  return nullptr;
#endif
}

// Why "cuda" is absent here, for a skip message.
inline std::string no_cuda_reason() {
#ifdef TROUPE_HAVE_CUDA
  auto d = gpu::make_cuda_device(0);
  return d.ok() ? std::string("a CUDA device is present") : std::string(d.status().message());
#else
  return "the CUDA backend is not built (no CUDA toolkit at configure time)";
#endif
}

}  // namespace troupe::testing
