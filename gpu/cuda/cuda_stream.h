// The CUDA backend's stream and device (internal to gpu/cuda; users see
// gpu/device.h and make_cuda_device).
//
// Errors are sticky per stream, as on the CPU backend:
// - a failed launch or cuBLASLt call fails the stream with the op's name;
// - a kernel that finds bad data (a token id out of range) sets the stream's
//   fault word on the device; later kernels of the stream then do nothing,
//   and the stream reports the fault, naming the op, once it reaches the host:
//   at synchronize(), and before each host callback (the word is copied to
//   pinned host memory on the stream itself, so no callback calls CUDA);
// - an asynchronous fault of the device (an illegal address) is caught at
//   synchronize() and reported with the ops enqueued since the last
//   synchronisation; with TROUPE_CUDA_SYNC=1 every op is synchronised as it is
//   enqueued, so the error names the op that failed.
//
// Lifetimes: a tensor's storage may be dropped by its owner while an op that
// uses it is still queued; the stream holds every op's storages until an
// event recorded after the op (even one whose launch failed part-way) has
// completed, as the CPU backend's lambdas hold theirs. Storage comes from a
// pool of the device's own (cudaMallocFromPoolAsync on one allocation
// stream, freed memory kept for reuse); a free is deferred to the next
// allocation or synchronisation on a host thread, so a host callback that
// drops the last view of a tensor never calls CUDA. A stream's own buffers
// (fault word, GEMM workspace) come from the same pool and a device-wide
// pinned slab, so making or destroying a stream never synchronises the
// device.
//
// Host callbacks run after every earlier op, failed or not, as on the CPU;
// one that CUDA cannot enqueue runs at once on the caller's thread, after
// the stream has been failed. After an asynchronous device fault they still
// run (cudaStreamAddCallback), and the fault fails the stream first; a
// launch after it is not made, and fails the stream with the fault, not as
// its own error.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/cuda/cuda_launch.h"
#include "gpu/cuda/cuda_matmul.h"
#include "gpu/device.h"

namespace troupe::gpu::cuda {

absl::Status cuda_status(cudaError_t err, absl::string_view what);

class CudaDevice;
class OpTimes;

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDevice& device, int index, bool tf32);
  ~CudaStream() override;

  Device& device() override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void host_callback(std::function<void()> fn) override;
  absl::Status synchronize() override;
  void device_call(const char* name, std::vector<Tensor> held,
                   std::function<absl::Status(void* native_stream)> call) override;
  absl::Status status() override;
  void fail(absl::Status error) override;

  // Enqueues op `name`: `launch` enqueues its kernels and returns the launch
  // status; `args` are held until the op has run. Skipped once the stream has
  // failed. Named in an NVTX range.
  void run_op(const char* name, absl::Span<const Tensor* const> args,
              const std::function<absl::Status(const Launch&)>& launch);
  // The stream's GEMM context (its workspace is made on first use).
  absl::StatusOr<Gemm> gemm();
  // Device scratch of at least `bytes` for one op, held with the op's
  // tensors (so run_op must name it among `args`). Out of memory fails the
  // stream (ResourceExhausted) and returns an undefined tensor.
  //
  // One buffer per stream, reused by every op and grown when an op needs
  // more: the stream runs its ops one after another, so an op's scratch is
  // free once the op before it has run, and a buffer that was replaced
  // stays alive while ops in flight hold it. No allocation (which orders
  // itself with the device's other streams) per op on the hot path.
  Tensor scratch(std::size_t bytes);
  cudaStream_t get() const { return stream_; }

 private:
  struct InFlight {
    cudaEvent_t done;
    std::vector<std::shared_ptr<Storage>> held;
    cudaEvent_t start = nullptr;  // with TROUPE_CUDA_OP_TIMES (op_times.h)
    std::string name;
  };
  void check(cudaError_t err, absl::string_view what);
  // An asynchronous error the stream found `where`, with the ops it may be
  // in; `named` false: the error's number, not CUDA's name for it (a host
  // callback makes no CUDA call, not even that one).
  absl::Status async_fault(cudaError_t err, absl::string_view where, bool named = true);
  // run_op's and device_call's launch: `held` stays alive until an event
  // recorded after the launch has completed; after a launch that failed,
  // until the stream is destroyed (a library that gave up may still put
  // its kernel on the stream behind that event: NCCL's launch thread after
  // an abort).
  void launch_held(const char* name, std::vector<std::shared_ptr<Storage>> held,
                   const std::function<absl::Status(const Launch&)>& launch);
  // Releases what completed ops held; all of it when `all` (after a sync).
  void retire(bool all);
  // The fault the device reported, if the host copy of the word shows one.
  void take_fault();

  CudaDevice& device_;
  int index_;
  cudaStream_t stream_ = nullptr;
  int slot_ = -1;                   // this stream's fault word in the device's slabs
  unsigned* fault_ = nullptr;       // device: the fault word
  unsigned* fault_host_ = nullptr;  // pinned host copy, updated on the stream
  std::shared_ptr<Storage> workspace_;
  Tensor scratch_;  // scratch()'s buffer (f64 elements)
  bool sync_each_op_ = false;
  std::unique_ptr<OpTimes> times_;  // TROUPE_CUDA_OP_TIMES: each op's GPU time
  bool tf32_ = false;               // StreamOptions::tf32, for its GEMMs
  std::mutex mu_;  // error_, in_flight_, kept_, recent_, free_events_, workspace_, scratch_
  absl::Status error_;
  std::deque<InFlight> in_flight_;
  std::vector<std::shared_ptr<Storage>> kept_;  // failed launches' tensors, until ~CudaStream
  std::vector<cudaEvent_t> free_events_;
  std::deque<std::string> recent_;  // ops since the last synchronisation
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index);
  ~CudaDevice() override;
  absl::Status init();

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  int index() const override { return index_; }
  std::string name() const override;
  bool host_visible() const override { return false; }
  std::shared_ptr<Storage> allocate(std::size_t bytes) override;
  // Pinned (cudaHostAlloc). A freed buffer is kept for the next request of
  // its size and returned to CUDA only by ~CudaDevice: cudaFreeHost
  // synchronises the device, which no allocation or stream may do.
  std::shared_ptr<Storage> allocate_host(std::size_t bytes) override;
  std::int64_t allocated_bytes() const override { return live_bytes_->load(); }
  std::unique_ptr<Stream> make_stream(StreamOptions options) override;
  std::unique_ptr<Event> make_event() override;
  absl::Status copy_to_host(const Tensor& src, void* dst) override;
  absl::Status copy_from_host(const void* src, const Tensor& dst) override;
  Kernels& kernels() override { return *kernels_; }

  const CublasLt* lt_api() const { return lt_api_; }
  cublasLtHandle_t lt() const { return lt_; }
  // A fault-word slot (a device pair and its pinned host copy) for a new
  // stream, or -1 when all kMaxStreams are taken; given back by release_slot.
  int take_slot(unsigned** device_word, unsigned** host_word);
  void release_slot(int slot);
  static constexpr int kMaxStreams = 4096;
  // Frees the storage whose last view went away (on a host thread that may
  // call CUDA).
  void free_deferred();

 private:
  struct Deferred {
    std::mutex mu;
    std::vector<void*> ptrs;
    std::vector<std::pair<void*, std::size_t>> host_free;  // pinned buffers to reuse
  };
  absl::Status copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                    absl::string_view what);

  int index_;
  cudaStream_t io_stream_ = nullptr;  // allocation, frees and host copies
  std::mutex io_mu_;
  cudaMemPool_t pool_ = nullptr;     // troupe's own: no other library's allocations wait on ours
  unsigned* fault_words_ = nullptr;  // device: kMaxStreams pairs
  unsigned* fault_words_host_ = nullptr;  // pinned: kMaxStreams pairs
  std::mutex slot_mu_;
  std::vector<int> free_slots_;
  const CublasLt* lt_api_ = nullptr;  // gpu/cuda/cublaslt.h, opened by init
  cublasLtHandle_t lt_ = nullptr;
  std::unique_ptr<Kernels> kernels_;
  std::shared_ptr<Deferred> deferred_ = std::make_shared<Deferred>();
  std::shared_ptr<std::atomic<std::int64_t>> live_bytes_ =
      std::make_shared<std::atomic<std::int64_t>>(0);
};

std::unique_ptr<Kernels> make_cuda_kernels();

}  // namespace troupe::gpu::cuda
