// NCCL collectives, issued in order on one thread and stream per communicator.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/nccl_plan.h"
#include "gpu/thread_name.h"

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

// How often the issuing thread asks NCCL for asynchronous errors while
// operations are on the stream (a dead peer leaves NCCL's kernels waiting:
// only ncclCommGetAsyncError tells, and only ncclCommAbort frees them).
constexpr auto kErrorPoll = std::chrono::milliseconds(10);

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream, int rank, int size, int device)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), device_(device) {
    issuer_ = std::thread([this] {
      gpu::name_this_thread("nccl");
      issue_loop();
    });
  }
  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    issuer_.join();  // runs what was queued, waits for the stream, finalizes (all bounded)
    cudaSetDevice(device_);
    // Nothing of ours is left on the stream (every host function ran, or the
    // communicator was aborted): bounded all the same.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cudaStreamQuery(stream_) == cudaErrorNotReady &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!abort_done_) ncclCommDestroy(comm_);  // finalized; an aborted one is already freed
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(float* data, std::size_t n, Callback done) override {
    enqueue({{NcclCall::Op::kAllReduce, {NcclCall::Buffer::kIn, 0}, {NcclCall::Buffer::kIn, 0}, n}},
            data, data, std::move(done));
  }
  void reduce_scatter(const float* in, float* out, std::size_t n, Callback done) override {
    enqueue(plan_reduce_scatter(n, size_, rank_), in, out, std::move(done));
  }
  void all_gather(const float* in, float* out, std::size_t n, Callback done) override {
    enqueue(plan_all_gather(n, size_, rank_), in, out, std::move(done));
  }
  void broadcast(float* data, std::size_t n, int root, Callback done) override {
    enqueue({{NcclCall::Op::kBroadcast,
              {NcclCall::Buffer::kIn, 0},
              {NcclCall::Buffer::kIn, 0},
              n,
              root}},
            data, data, std::move(done));
  }

  absl::Status all_reduce_on(void* stream, float* data, std::size_t n) override {
    return issue_calls_on(
        stream,
        {{NcclCall::Op::kAllReduce, {NcclCall::Buffer::kIn, 0}, {NcclCall::Buffer::kIn, 0}, n}},
        data, data);
  }
  absl::Status reduce_scatter_on(void* stream, const float* in, float* out,
                                 std::size_t n) override {
    return issue_calls_on(stream, plan_reduce_scatter(n, size_, rank_), in, out);
  }
  absl::Status all_gather_on(void* stream, const float* in, float* out, std::size_t n) override {
    return issue_calls_on(stream, plan_all_gather(n, size_, rank_), in, out);
  }
  absl::Status reduce_on(void* stream, const float* in, float* out, std::size_t n,
                         int root) override {
    if (root < 0 || root >= size_) return bad_root("reduce", root);
    return issue_calls_on(
        stream,
        {{NcclCall::Op::kReduce, {NcclCall::Buffer::kIn, 0}, {NcclCall::Buffer::kOut, 0}, n, root}},
        in, out);
  }
  absl::Status broadcast_on(void* stream, const void* in, void* out, std::size_t bytes,
                            int root) override {
    if (root < 0 || root >= size_) return bad_root("broadcast", root);
    return issue_on(stream, [&](cudaStream_t s) {
      return settle(ncclBroadcast(in, out, bytes, ncclUint8, root, comm_, s), "ncclBroadcast");
    });
  }
  absl::Status send_on(void* stream, const void* data, std::size_t bytes, int peer) override {
    if (peer < 0 || peer >= size_ || peer == rank_) return bad_peer(peer);
    return issue_on(stream, [&](cudaStream_t s) {
      return settle(ncclSend(data, bytes, ncclUint8, peer, comm_, s), "ncclSend");
    });
  }
  absl::Status recv_on(void* stream, void* data, std::size_t bytes, int peer) override {
    if (peer < 0 || peer >= size_ || peer == rank_) return bad_peer(peer);
    return issue_on(stream, [&](cudaStream_t s) {
      return settle(ncclRecv(data, bytes, ncclUint8, peer, comm_, s), "ncclRecv");
    });
  }
  void on_failure(std::function<void(absl::Status)> failed) override {
    std::lock_guard<std::mutex> lock(mu_);
    on_failure_ = std::move(failed);
  }
  // Any thread. The abort itself runs on the issuing thread, between two of
  // its NCCL calls (a regression: an abort from here could land between the
  // issuing thread's check and its call, on a communicator being freed).
  void fail(absl::Status why) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) return;
      aborted_ = why;
      on_failure_ = nullptr;  // the caller knows
    }
    cv_.notify_all();
  }

 private:
  struct Task {
    std::vector<NcclCall> calls;
    const float* in;
    float* out;
    Callback done;
  };
  // A call on a stream whose operations have completed: what it says then.
  struct Pending {
    NcclComm* comm;
    Callback done;
  };

  absl::Status bad_root(const char* what, int root) const {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL ", what, " with root ", root, " in a group of ", size_));
  }
  absl::Status bad_peer(int peer) const {
    return absl::InvalidArgumentError(absl::StrCat("NCCL point-to-point with member ", peer,
                                                   " from member ", rank_, " of ", size_));
  }
  absl::Status issue_calls_on(void* stream, const std::vector<NcclCall>& calls, const float* in,
                              float* out) {
    return issue_on(stream, [&](cudaStream_t s) { return issue(calls, in, out, s); });
  }

  // A stream-ordered call (`enqueue`, under call_mu_), on the caller's
  // thread. From the first one on, the issuing thread polls NCCL's
  // asynchronous errors (the kernels of a call whose member died wait
  // until the communicator is aborted).
  absl::Status issue_on(void* stream, const std::function<absl::Status(cudaStream_t)>& enqueue) {
    std::lock_guard<std::mutex> call(call_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) return aborted_;
      watching_ = true;
    }
    cv_.notify_all();
    cudaSetDevice(device_);
    absl::Status st = enqueue(static_cast<cudaStream_t>(stream));
    if (!st.ok()) {
      // As for the issuing thread's own calls: the communicator is aborted
      // (by that thread, which takes call_mu_ once this call has let it go).
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_.ok()) aborted_ = st;
      }
      cv_.notify_all();
    }
    return st;
  }

  void enqueue(std::vector<NcclCall> calls, const float* in, float* out, Callback done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back({std::move(calls), in, out, std::move(done)});
    }
    cv_.notify_all();
  }

  // The issuing thread: tasks in order; while operations are on the stream,
  // NCCL's asynchronous errors every kErrorPoll; the abort when asked.
  void issue_loop() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto ready = [&] { return stop_ || !tasks_.empty() || (!aborted_.ok() && !abort_done_); };
      if (in_flight_ > 0 || watching_) {
        cv_.wait_for(lock, kErrorPoll, ready);
      } else {
        cv_.wait(lock, ready);
      }
      if (!aborted_.ok() && !abort_done_) abort_locked(lock);
      if ((in_flight_ > 0 || watching_) && !abort_done_) {
        lock.unlock();
        absl::Status err = async_error();
        lock.lock();
        if (!err.ok() && aborted_.ok()) {
          aborted_ = err;
          abort_locked(lock);
        }
      }
      if (!tasks_.empty()) {
        Task t = std::move(tasks_.front());
        tasks_.pop_front();
        absl::Status st = aborted_;
        lock.unlock();
        if (st.ok()) {
          {
            std::lock_guard<std::mutex> call(call_mu_);
            st = issue(t.calls, t.in, t.out, stream_);
          }
          // NCCL says an error while enqueueing leaves the communicator to
          // be aborted; later calls fail with the same reason.
          if (!st.ok()) {
            lock.lock();
            if (aborted_.ok()) aborted_ = st;
            if (!abort_done_) abort_locked(lock);
            lock.unlock();
          }
        }
        if (st.ok()) st = on_stream_done(std::move(t.done));
        if (!st.ok() && t.done) run_callback(t.done, st);
        lock.lock();
        continue;
      }
      if (stop_ && drain_before_stop(lock)) return;
    }
  }

  // Stopping: the stream's operations finish first; one still there after
  // a minute is taken for a hang and aborted (the destructor must not wait
  // for ever on cudaStreamSynchronize).
  bool drain_before_stop(std::unique_lock<std::mutex>& lock) {
    if (abort_done_) return true;
    if (in_flight_ == 0) {
      finalize_locked(lock);
      return true;
    }
    if (stop_since_ == std::chrono::steady_clock::time_point{})
      stop_since_ = std::chrono::steady_clock::now();
    if (std::chrono::steady_clock::now() - stop_since_ > std::chrono::seconds(60)) {
      if (aborted_.ok())
        aborted_ = absl::DeadlineExceededError(
            "NCCL operations still running "
            "60 s after the communicator was "
            "destroyed");
      abort_locked(lock);
      return true;
    }
    cv_.wait_for(lock, kErrorPoll);
    return false;
  }

  // Holds mu_ (released around the calls): ncclCommFinalize, which needs
  // every member, bounded (a member that is gone would hold it for ever):
  // after 30 s, or on an error, the communicator is aborted instead. Then
  // the destructor's ncclCommDestroy only frees local resources.
  void finalize_locked(std::unique_lock<std::mutex>& lock) {
    lock.unlock();
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> call(call_mu_);
      r = ncclCommFinalize(comm_);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ncclCommGetAsyncError(comm_, &r);
      }
    }
    lock.lock();
    if (r != ncclSuccess) {
      if (aborted_.ok())
        aborted_ = nccl_status(r == ncclInProgress ? ncclSystemError : r, "ncclCommFinalize");
      abort_locked(lock);
    }
  }

  // Holds mu_ (released around the call): frees kernels waiting on a dead
  // member; the streams then run on, each pending callback reports the
  // abort's reason, and the owner of stream-ordered calls hears it through
  // on_failure (once). Not while a call is being made: a stream-ordered call
  // in progress sees aborted_ (set before this) and returns, letting
  // call_mu_ go.
  void abort_locked(std::unique_lock<std::mutex>& lock) {
    abort_done_ = true;
    const absl::Status why = aborted_;
    std::function<void(absl::Status)> failed = watching_ ? std::move(on_failure_) : nullptr;
    on_failure_ = nullptr;
    lock.unlock();
    {
      std::lock_guard<std::mutex> call(call_mu_);
      ncclCommAbort(comm_);
    }
    if (failed) failed(why);
    lock.lock();
  }

  // Only when no call is being made: on a non-blocking communicator
  // ncclCommGetAsyncError also completes a call's pending launch (it joins
  // NCCL's launch thread), which the caller's settle() may be doing at the
  // same moment. A call in progress reports its own errors (settle).
  absl::Status async_error() {
    std::unique_lock<std::mutex> call(call_mu_, std::try_to_lock);
    if (!call.owns_lock()) return absl::OkStatus();
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return nccl_status(r, "ncclCommGetAsyncError");
    if (state == ncclInProgress) return absl::OkStatus();
    return nccl_status(state, absl::StrCat("NCCL (rank ", rank_, " of ", size_, ")"));
  }

  // A non-blocking communicator returns ncclInProgress until the call has
  // been enqueued; the next call may be made only once it has.
  // (A stream-ordered call waits here on an actor's thread: it yields at
  // first, then sleeps, so a long wait does not hold a core.)
  absl::Status settle(ncclResult_t r, absl::string_view what) {
    for (int spins = 0; r == ncclInProgress; spins++) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!aborted_.ok()) return aborted_;
      }
      if (spins < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      ncclCommGetAsyncError(comm_, &r);
    }
    return nccl_status(r, what);
  }

  // Holds call_mu_: `calls` on `stream`, as one group when there are several.
  absl::Status issue(const std::vector<NcclCall>& calls, const float* in, float* out,
                     cudaStream_t stream) {
    auto ptr = [&](const NcclCall::Ref& ref) -> float* {
      float* base = ref.buffer == NcclCall::Buffer::kIn ? const_cast<float*>(in) : out;
      return base + ref.offset;
    };
    const bool group = calls.size() > 1;
    if (group) {
      if (absl::Status st = nccl_status(ncclGroupStart(), "ncclGroupStart"); !st.ok()) return st;
    }
    ncclResult_t r = ncclSuccess;
    for (const NcclCall& c : calls) {
      switch (c.op) {
        case NcclCall::Op::kAllReduce:
          r = ncclAllReduce(ptr(c.send), ptr(c.recv), c.count, ncclFloat, ncclSum, comm_, stream);
          break;
        case NcclCall::Op::kReduceScatter:
          r = ncclReduceScatter(ptr(c.send), ptr(c.recv), c.count, ncclFloat, ncclSum, comm_,
                                stream);
          break;
        case NcclCall::Op::kAllGather:
          r = ncclAllGather(ptr(c.send), ptr(c.recv), c.count, ncclFloat, comm_, stream);
          break;
        case NcclCall::Op::kReduce:
          r = ncclReduce(ptr(c.send), ptr(c.recv), c.count, ncclFloat, ncclSum, c.root, comm_,
                         stream);
          break;
        case NcclCall::Op::kBroadcast:
          r = ncclBroadcast(ptr(c.send), ptr(c.recv), c.count, ncclFloat, c.root, comm_, stream);
          break;
      }
      if (r != ncclSuccess && r != ncclInProgress) break;
    }
    if (group) {
      const ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess || r == ncclInProgress) r = end;
    }
    return settle(r, group ? "NCCL group" : "NCCL collective");
  }

  // The callback runs when the stream gets there, with the abort's reason
  // if the communicator was aborted meanwhile (aborted kernels end early),
  // or the device's fault (cudaStreamAddCallback runs it after one, where
  // a host function would never run).
  absl::Status on_stream_done(Callback done) {
    auto* p = new Pending{this, std::move(done)};
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_++;
    }
    cudaError_t e = cudaStreamAddCallback(
        stream_,
        [](cudaStream_t, cudaError_t status, void* raw) {
          std::unique_ptr<Pending> p(static_cast<Pending*>(raw));
          absl::Status st;
          {
            std::lock_guard<std::mutex> lock(p->comm->mu_);
            st = p->comm->aborted_;
            p->comm->in_flight_--;
          }
          if (st.ok() && status != cudaSuccess) {
            // (Its number: no CUDA call, not even for a name, in a callback.)
            st = absl::InternalError(
                absl::StrCat("the NCCL stream: CUDA error ", static_cast<int>(status)));
          }
          p->comm->cv_.notify_all();
          run_callback(p->done, std::move(st));  // no CUDA or NCCL calls in here
        },
        p, 0);
    if (e != cudaSuccess) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        in_flight_--;
      }
      Callback d = std::move(p->done);
      delete p;
      run_callback(d, cuda_status(e, "cudaStreamAddCallback"));
    }
    return absl::OkStatus();
  }

  // A callback that throws must not end the process from a CUDA or NCCL
  // thread: it is a bug of the caller, reported on standard error.
  static void run_callback(Callback& done, absl::Status st) {
    try {
      done(std::move(st));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe: an NCCL completion callback threw: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "troupe: an NCCL completion callback threw\n");
    }
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int rank_, size_, device_;
  // Held around every NCCL call on comm_, the error polls' too (taken
  // before mu_).
  std::mutex call_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;                        // guarded by mu_
  absl::Status aborted_;                          // guarded by mu_: why, once failed
  bool abort_done_ = false;                       // guarded by mu_: ncclCommAbort has been called
  int in_flight_ = 0;                             // guarded by mu_: operations on the stream
  bool stop_ = false;                             // guarded by mu_
  bool watching_ = false;                         // guarded by mu_: a stream-ordered call was made
  std::function<void(absl::Status)> on_failure_;  // guarded by mu_
  std::chrono::steady_clock::time_point stop_since_{};
  std::thread issuer_;
};

}  // namespace

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);
static_assert(sizeof(cudaUUID_t) == kCudaUuidBytes);

absl::StatusOr<std::string> cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  absl::Status st = cuda_status(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  if (!st.ok()) return st;
  return std::string(reinterpret_cast<const char*>(&prop.uuid), sizeof prop.uuid);
}

absl::StatusOr<std::string> nccl_unique_id() {
  ncclUniqueId id;
  absl::Status st = nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (!st.ok()) return st;
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(
    const std::string& unique_id, int rank, int size, int device,
    const std::atomic<bool>* cancelled) {
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
  // Non-blocking: no NCCL call blocks the issuing thread, so an abort (or
  // an asynchronous error) is seen between calls; init is waited for here.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline &&
         !(cancelled != nullptr && cancelled->load())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &r);
  }
  if (r == ncclInProgress && cancelled != nullptr && cancelled->load()) {
    ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return absl::CancelledError("ncclCommInitRankConfig: cancelled (the job ended)");
  }
  if (r == ncclInProgress) {
    ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return absl::DeadlineExceededError(
        absl::StrCat("ncclCommInitRankConfig: rank ", rank, " of ", size,
                     " not initialised after 5 minutes (a member missing?)"));
  }
  st = nccl_status(r, "ncclCommInitRankConfig");
  if (!st.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return st;
  }
  return std::unique_ptr<NcclCommunicator>(
      std::make_unique<NcclComm>(comm, stream, rank, size, device));
}

}  // namespace troupe::comm
