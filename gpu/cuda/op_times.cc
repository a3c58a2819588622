#include "gpu/cuda/op_times.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace troupe::gpu::cuda {

std::unique_ptr<OpTimes> OpTimes::from_env(int device) {
  const char* path = std::getenv("TROUPE_CUDA_OP_TIMES");
  if (path == nullptr || *path == '\0') return nullptr;
  return std::unique_ptr<OpTimes>(new OpTimes(path, device));
}

cudaEvent_t OpTimes::event() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  return cudaEventCreate(&e) == cudaSuccess ? e : nullptr;
}

void OpTimes::add(const std::string& name, cudaEvent_t start, cudaEvent_t end) {
  float ms = 0;
  const bool timed = cudaEventElapsedTime(&ms, start, end) == cudaSuccess;
  std::lock_guard<std::mutex> lock(mu_);
  if (timed) {
    Sum& s = ops_[name];
    s.count++;
    s.ms += ms;
    busy_ms_ += ms;
  }
  if (first_ == nullptr) {
    first_ = start;
  } else {
    pool_.push_back(start);
  }
  if (last_ != nullptr) pool_.push_back(last_);
  last_ = end;
}

OpTimes::~OpTimes() {
  float span = 0;
  if (first_ != nullptr && last_ != nullptr) (void)cudaEventElapsedTime(&span, first_, last_);
  std::string line =
      absl::StrFormat(R"({"pid": %d, "device": %d, "span_ms": %.4f, "busy_ms": %.4f, "ops": {)",
                      static_cast<int>(getpid()), device_, span, busy_ms_);
  bool first = true;
  for (const auto& [name, s] : ops_) {
    absl::StrAppend(&line, first ? "" : ", ",
                    absl::StrFormat(R"("%s": {"count": %d, "ms": %.4f})", name, s.count, s.ms));
    first = false;
  }
  absl::StrAppend(&line, "}}\n");
  // One write of the whole line with O_APPEND: lines of several streams and
  // processes do not interleave.
  const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!write(fd, line.data(), line.size());
    close(fd);
  }
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  if (first_ != nullptr) cudaEventDestroy(first_);
  if (last_ != nullptr) cudaEventDestroy(last_);
}

}  // namespace troupe::gpu::cuda
