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

// The GPU of this process: `local_rank`'s, else LOCAL_RANK's (as troupe
// launch and torchrun set it), else the first.
int local_gpu(int local_rank) {
  if (local_rank >= 0) return local_rank;
  const char* env = std::getenv("LOCAL_RANK");
  int local = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &local) && local >= 0) return local;
  return 0;
}

}  // namespace

DefaultDevice default_device(const TrainFlags& f, bool process_per_rank, int gpus, int workers,
                             const std::string& unsupported_gpu) {
  auto cpu = [](std::string why) { return DefaultDevice{"cpu", std::move(why)}; };
  if (gpus <= 0) return cpu("no GPU is visible");
  if (!unsupported_gpu.empty()) return cpu(unsupported_gpu);
  if (!f.op_cost.empty()) return cpu("--debug-op-cost's fixed-cost chunks run on the CPU");
  const int tp = f.parallel.tp;
  if (!process_per_rank && tp > 1) {
    return cpu(absl::StrCat("a GPU is visible, but --tp ", tp,
                            " in one process would put every rank on it (troupe launch gives "
                            "each rank its own)"));
  }
#ifndef TROUPE_HAVE_NCCL
  if (tp > 1) {
    return cpu(absl::StrCat("a GPU is visible, but --tp ", tp,
                            " on GPUs needs NCCL, and this troupe was built without it"));
  }
#endif
  const std::string visible = absl::StrCat(gpus, " GPU", gpus == 1 ? " is" : "s are", " visible");
  if (process_per_rank && workers > gpus) {
    return cpu(absl::StrCat(workers, " workers on this host but ", visible,
                            ": each worker needs a GPU of its own (give --device cuda where "
                            "each was given one, as CUDA_VISIBLE_DEVICES per worker does)"));
  }
  const int world = f.parallel.world();
  if (!process_per_rank && world > 1) {
    return {"cuda", absl::StrCat(visible, "; the ", world, " ranks of this process share one")};
  }
  return {"cuda", visible};
}

std::string resolve_device(TrainFlags& f, bool process_per_rank, int workers) {
  if (!f.device.empty()) return "";
#ifdef TROUPE_HAVE_CUDA
  const int gpus = gpu::cuda_device_count();
  const std::string unsupported = gpus > 0 ? gpu::cuda_unsupported_device() : "";
#else
  const int gpus = 0;
  const std::string unsupported;
#endif
  DefaultDevice d = default_device(f, process_per_rank, gpus, workers, unsupported);
  f.device = d.device;
  if (gpus == 0) return "";  // (the CPU, as always where no GPU is)
  return absl::StrCat(d.device, " by default: ", d.why, " (give --device to choose)");
}

absl::Status check_device(const TrainFlags& f, bool process_per_rank) {
  if (f.device.empty() || f.device == "cpu") return absl::OkStatus();
  if (f.device != "cuda" && f.device != "opaque") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", f.device, ": want cpu, cuda or opaque (the flag's, else TROUPE_DEVICE's)"));
  }
  if (!f.op_cost.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", f.device,
        " with --debug-op-cost: its fixed-cost model chunks are the CPU's; give --device cpu"));
  }
  if (f.device == "cuda" && f.parallel.tp > 1 && !process_per_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device cuda with --tp ", f.parallel.tp,
        " in one process: its ranks would share one GPU, and the TP group's NCCL communicator "
        "needs a GPU per rank. Run it with troupe launch (a process and a GPU per rank), or "
        "give --device cpu; pipeline and data parallelism (--pp, --dp) run here"));
  }
#ifndef TROUPE_HAVE_CUDA
  if (f.device == "cuda") {
    return absl::InvalidArgumentError("--device cuda: this troupe was built without CUDA");
  }
#elif !defined(TROUPE_HAVE_NCCL)
  if (f.device == "cuda" && f.parallel.tp > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device cuda with --tp ", f.parallel.tp,
        ": tensor parallelism on GPUs needs NCCL, and this troupe was built without it"));
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<RunDevice> open_device(const TrainFlags& f, int local_rank, bool process_per_rank) {
  if (absl::Status st = check_device(f, process_per_rank); !st.ok()) return st;
  RunDevice out;
  if (f.device == "opaque") {
    out.owned = gpu::make_opaque_cpu_device();
    out.device = out.owned.get();
    return out;
  }
  if (f.device != "cuda") {
    out.device = &gpu::cpu_device();
    return out;
  }
#ifdef TROUPE_HAVE_CUDA
  // A process that sees one GPU (srun --gpus-per-task, CUDA_VISIBLE_DEVICES
  // per rank) uses it whatever its local rank.
  const int index = gpu::cuda_device_count() == 1 ? 0 : local_gpu(local_rank);
  absl::StatusOr<std::unique_ptr<gpu::Device>> dev = gpu::make_cuda_device(index);
  if (!dev.ok()) {
    return absl::Status(dev.status().code(),
                        absl::StrCat("--device cuda: ", dev.status().message()));
  }
  out.owned = std::move(*dev);
  out.device = out.owned.get();
  return out;
#else
  (void)local_gpu;
  (void)local_rank;
  return absl::InvalidArgumentError(
      "--device cuda: this troupe was built without CUDA");  // (checked)
#endif
}

}  // namespace troupe::api
