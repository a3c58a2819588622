// --device: the device a run computes on.
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api/train_flags.h"
#ifdef TROUPE_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace troupe::api {
namespace {

// The GPU of this process: LOCAL_RANK's (as torchrun sets it), else the first.
int local_gpu() {
  const char* env = std::getenv("LOCAL_RANK");
  int local = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &local) && local >= 0) return local;
  return 0;
}

}  // namespace

absl::StatusOr<RunDevice> open_device(const std::string& flag, bool runs_actors) {
  RunDevice out;
  // The default stays the CPU until the CUDA training path has run on a
  // GPU (docs/CUDA.md): a run without --device never changes backend.
  if (flag.empty() || flag == "cpu") {
    out.device = &gpu::cpu_device();
    return out;
  }
  if (flag != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--device ", flag, ": want cpu or cuda"));
  }
  if (runs_actors) {
    return absl::InvalidArgumentError(
        "--device cuda: the actors' runtime (--tp, --pp, --dp, --virtual-stages, --trace, "
        "--debug-op-cost, troupe launch) runs on the CPU so far; train one rank on the GPU, or "
        "give --device cpu");
  }
#ifdef TROUPE_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<gpu::Device>> dev = gpu::make_cuda_device(local_gpu());
  if (!dev.ok()) {
    return absl::Status(dev.status().code(),
                        absl::StrCat("--device cuda: ", dev.status().message()));
  }
  out.owned = std::move(*dev);
  out.device = out.owned.get();
  return out;
#else
  (void)local_gpu;
  return absl::InvalidArgumentError("--device cuda: this troupe was built without CUDA");
#endif
}

}  // namespace troupe::api
