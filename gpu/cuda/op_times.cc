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

void OpTimes::started(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (span_start_ != nullptr) return;
  if (cudaEventCreate(&span_start_) != cudaSuccess) {
    span_start_ = nullptr;
  } else if (cudaEventRecord(span_start_, s) != cudaSuccess) {
    cudaEventDestroy(span_start_);
    span_start_ = nullptr;
  }
}

void OpTimes::ended(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (span_end_ == nullptr && cudaEventCreate(&span_end_) != cudaSuccess) {
    span_end_ = nullptr;
    return;
  }
  span_recorded_ = cudaEventRecord(span_end_, s) == cudaSuccess;
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

void OpTimes::give_back(cudaEvent_t e) {
  if (e == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  pool_.push_back(e);
}

void OpTimes::add(const std::string& name, cudaEvent_t start, cudaEvent_t end) {
  float ms = 0;
  const bool timed = cudaEventElapsedTime(&ms, start, end) == cudaSuccess;
  std::lock_guard<std::mutex> lock(mu_);
  if (timed) {
    Sum& sum = ops_[name];
    sum.count++;
    sum.ms += ms;
    busy_ms_ += ms;
  }
  pool_.push_back(start);
  pool_.push_back(end);
}

void OpTimes::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (span_end_ != nullptr && span_recorded_) {
    span_recorded_ = cudaEventSynchronize(span_end_) == cudaSuccess;
  }
}

OpTimes::~OpTimes() {
  float span = 0;
  if (span_start_ != nullptr && span_end_ != nullptr && span_recorded_) {
    (void)cudaEventElapsedTime(&span, span_start_, span_end_);
  }
  std::string line =
      absl::StrFormat(R"({"pid": %d, "device": %d, "span_ms": %.4f, "busy_ms": %.4f, "ops": {)",
                      static_cast<int>(getpid()), device_, span, busy_ms_);
  bool first = true;
  for (const auto& [name, sum] : ops_) {
    absl::StrAppend(&line, first ? "" : ", ",
                    absl::StrFormat(R"("%s": {"count": %d, "ms": %.4f})", name, sum.count, sum.ms));
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
  if (span_start_ != nullptr) cudaEventDestroy(span_start_);
  if (span_end_ != nullptr) cudaEventDestroy(span_end_);
}

}  // namespace troupe::gpu::cuda
