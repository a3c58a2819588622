// The GPU time of each op of a CUDA stream, from events recorded around it,
// when TROUPE_CUDA_OP_TIMES names a file (nsys does not run on every GPU
// machine; scripts/gpu-check sets it for one training run). When the stream
// ends, one JSON line is appended to the file:
//   {"pid": 1234, "device": 0, "span_ms": 812.4, "busy_ms": 760.1,
//    "ops": {"matmul_forward": {"count": 480, "ms": 120.5}, ...}}
// span_ms: from an event recorded before the first timed op to one
// recorded after the last; busy_ms: the ops' own times
// summed, so span - busy is the stream's idle time between ops (launch
// gaps, waits on the host or on other streams). Whole-run figures: a caller
// divides by steps. Ops are timed as enqueued by one thread at a time (the
// stream's owner, as troupe's streams are used); a failed launch is not
// counted. Timing events cost a little: a speed run leaves the variable
// unset.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::gpu::cuda {

class OpTimes {
 public:
  // Null unless TROUPE_CUDA_OP_TIMES is set.
  static std::unique_ptr<OpTimes> from_env(int device);
  ~OpTimes();  // appends the line; the stream has finished every op

  // Before an op is enqueued on `s`: records the span's start the first time.
  void started(cudaStream_t s);
  // A timing event for an op's start or end (from a pool; null when CUDA
  // cannot make one: the op is then not timed).
  cudaEvent_t event();
  void give_back(cudaEvent_t e);  // an event that timed nothing
  // An op that ran from `start` to `end`, both complete: its time is added
  // to its name's, and both events go back to the pool.
  void add(const std::string& name, cudaEvent_t start, cudaEvent_t end);
  // After a timed op is enqueued on `s`: the span's end, recorded again.
  void ended(cudaStream_t s);
  // When the stream has finished (the span's end has completed).
  void finish();

 private:
  explicit OpTimes(std::string path, int device) : path_(std::move(path)), device_(device) {}
  struct Sum {
    std::int64_t count = 0;
    double ms = 0;
  };
  std::mutex mu_;
  std::string path_;
  int device_;
  std::map<std::string, Sum> ops_;
  double busy_ms_ = 0;
  cudaEvent_t span_start_ = nullptr, span_end_ = nullptr;
  bool span_recorded_ = false;  // span_end_ recorded after the last timed op
  std::vector<cudaEvent_t> pool_;
};

}  // namespace troupe::gpu::cuda
