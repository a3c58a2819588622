// NCCL collectives, issued in order on one thread and stream per communicator.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/callback_queue.h"
#include "comm/communicator.h"

namespace troupe::comm {
namespace {

absl::Status nccl_status(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

absl::Status cuda_status(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream, int rank, int size, int device)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), device_(device) {
    issuer_->post([this] { cudaSetDevice(device_); });
  }
  ~NcclComm() override {
    issuer_.reset();  // drains the queue and joins its thread
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    if (aborted_.ok()) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(float* data, std::size_t n, Callback done) override {
    enqueue(
        [=, this] {
          return nccl_status(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_),
                             "ncclAllReduce");
        },
        std::move(done));
  }
  void reduce_scatter(const float* in, float* out, std::size_t n, Callback done) override {
    enqueue(
        [=, this] {
          if (n % static_cast<std::size_t>(size_) == 0) {
            return nccl_status(ncclReduceScatter(in, out, n / static_cast<std::size_t>(size_),
                                                 ncclFloat, ncclSum, comm_, stream_),
                               "ncclReduceScatter");
          }
          ncclGroupStart();
          for (int i = 0; i < size_; i++) {
            auto [b, e] = chunk_range(n, size_, i);
            ncclReduce(in + b, out, e - b, ncclFloat, ncclSum, i, comm_, stream_);
          }
          return nccl_status(ncclGroupEnd(), "ncclReduce (uneven reduce-scatter)");
        },
        std::move(done));
  }
  void all_gather(const float* in, float* out, std::size_t n, Callback done) override {
    enqueue(
        [=, this] {
          if (n % static_cast<std::size_t>(size_) == 0) {
            return nccl_status(ncclAllGather(in, out, n / static_cast<std::size_t>(size_),
                                             ncclFloat, comm_, stream_),
                               "ncclAllGather");
          }
          ncclGroupStart();
          for (int i = 0; i < size_; i++) {
            auto [b, e] = chunk_range(n, size_, i);
            ncclBroadcast(i == rank_ ? in : out + b, out + b, e - b, ncclFloat, i, comm_, stream_);
          }
          return nccl_status(ncclGroupEnd(), "ncclBroadcast (uneven all-gather)");
        },
        std::move(done));
  }
  void broadcast(float* data, std::size_t n, int root, Callback done) override {
    enqueue(
        [=, this] {
          return nccl_status(ncclBroadcast(data, data, n, ncclFloat, root, comm_, stream_),
                             "ncclBroadcast");
        },
        std::move(done));
  }
  void fail(absl::Status why) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) return;
      aborted_ = why;
    }
    ncclCommAbort(comm_);  // unblocks kernels waiting on the dead member
  }

 private:
  // NCCL calls go on the stream in issue order, from one thread; each
  // callback runs when the stream gets there.
  void enqueue(std::function<absl::Status()> issue, Callback done) {
    issuer_->post([this, issue = std::move(issue), done = std::move(done)]() mutable {
      absl::Status st;
      {
        std::lock_guard<std::mutex> lock(mu_);
        st = aborted_;
      }
      if (st.ok()) st = issue();
      if (!st.ok()) return done(st);
      auto* cb = new Callback(std::move(done));
      cudaError_t e = cudaLaunchHostFunc(
          stream_,
          [](void* p) {
            auto* c = static_cast<Callback*>(p);
            (*c)(absl::OkStatus());
            delete c;
          },
          cb);
      if (e != cudaSuccess) {
        (*cb)(cuda_status(e, "cudaLaunchHostFunc"));
        delete cb;
      }
    });
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int rank_, size_, device_;
  std::mutex mu_;
  absl::Status aborted_;
  std::unique_ptr<CallbackQueue> issuer_ = std::make_unique<CallbackQueue>();
};

}  // namespace

absl::StatusOr<std::string> nccl_unique_id() {
  ncclUniqueId id;
  absl::Status st = nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (!st.ok()) return st;
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(
    const std::string& unique_id, int rank, int size, int device) {
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError("NCCL unique id has the wrong size");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device, " for NCCL"));
  }
  absl::Status st = cuda_status(cudaSetDevice(device), "cudaSetDevice");
  if (!st.ok()) return st;
  cudaStream_t stream = nullptr;
  st = cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (!st.ok()) return st;
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof id);
  ncclComm_t comm = nullptr;
  st = nccl_status(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  if (!st.ok()) {
    cudaStreamDestroy(stream);
    return st;
  }
  return std::unique_ptr<NcclCommunicator>(
      std::make_unique<NcclComm>(comm, stream, rank, size, device));
}

}  // namespace troupe::comm
