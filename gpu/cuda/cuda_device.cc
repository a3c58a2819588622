// CudaDevice, CudaStream, CudaEvent on the CUDA runtime API (the contracts
// are in gpu/cuda/cuda_stream.h).
#include "gpu/cuda/cuda_device.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu/cuda/cublaslt.h"
#include "gpu/cuda/cuda_stream.h"
#include "gpu/cuda/op_times.h"
#include "gpu/kernels.h"

namespace troupe::gpu {
namespace cuda {

namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's advice for Hopper
constexpr std::size_t kRecentOps = 16;

// Every call sets its device first: the threads that call (an actor's,
// moving between CAF's scheduler threads) may have another current, and a
// CUDA call there would make a context on it (GPU 0 by default).
class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) : device_(device) {
    cudaSetDevice(device);
    cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
  }
  ~CudaEvent() override {
    cudaSetDevice(device_);
    cudaEventDestroy(event_);
  }
  // An error (a device fault) counts as done: the work will never complete,
  // and a caller polling must not spin for ever (the stream says why).
  bool query() override {
    cudaSetDevice(device_);
    return cudaEventQuery(event_) != cudaErrorNotReady;
  }
  void synchronize() override {
    cudaSetDevice(device_);
    cudaEventSynchronize(event_);
  }
  cudaEvent_t get() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

absl::Status cuda_status(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

// ---- CudaStream ----
// The fault word is cleared on the stream itself (cudaMemset would use the
// legacy stream, unordered with this non-blocking one).
CudaStream::CudaStream(CudaDevice& device, int index, bool tf32)
    : device_(device), index_(index), tf32_(tf32) {
  cudaSetDevice(index_);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  slot_ = device_.take_slot(&fault_, &fault_host_);
  if (slot_ < 0) {
    fail(absl::ResourceExhaustedError(
        absl::StrCat("more than ", CudaDevice::kMaxStreams, " CUDA streams at once")));
    return;
  }
  std::memset(fault_host_, 0, 2 * sizeof(unsigned));
  check(cudaMemsetAsync(fault_, 0, 2 * sizeof(unsigned), stream_), "cudaMemsetAsync(fault)");
  const char* sync = std::getenv("TROUPE_CUDA_SYNC");
  sync_each_op_ = sync != nullptr && std::strcmp(sync, "1") == 0;
  times_ = OpTimes::from_env(index_);
}

// No device-wide sync: the stream's buffers go back to the pool and slabs.
CudaStream::~CudaStream() {
  cudaSetDevice(index_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  retire(/*all=*/true);
  if (times_ != nullptr) times_->finish();
  times_.reset();  // (writes its line)
  kept_.clear();   // (the owner ended the libraries that used them before the stream)
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  workspace_.reset();
  scratch_.storage.reset();
  if (slot_ >= 0) device_.release_slot(slot_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  device_.free_deferred();
}

Device& CudaStream::device() { return device_; }

void CudaStream::check(cudaError_t err, absl::string_view what) {
  if (err != cudaSuccess) fail(cuda_status(err, what));
}

void CudaStream::record(Event& event) {
  if (stream_ == nullptr) return;  // (failed when it was made)
  cudaSetDevice(index_);
  check(cudaEventRecord(static_cast<CudaEvent&>(event).get(), stream_), "cudaEventRecord");
}

void CudaStream::wait(Event& event) {
  if (stream_ == nullptr) return;
  cudaSetDevice(index_);
  check(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(event).get(), 0),
        "cudaStreamWaitEvent");
}

absl::Status CudaStream::async_fault(cudaError_t err, absl::string_view where, bool named) {
  std::string ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ops = absl::StrJoin(recent_, ", ");
  }
  const std::string what = absl::StrCat(
      "an asynchronous CUDA error ", where, ", in an op since the last synchronisation (the last ",
      kRecentOps, " of this stream's: [", ops, "]; TROUPE_CUDA_SYNC=1 names the op)");
  if (named) return cuda_status(err, what);
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(err)));
}

// The fault word is copied to the host on the stream first, so the callback
// can report a fault of an earlier op without a CUDA call. An exception out
// of `fn` would end the process on CUDA's callback thread: it fails this
// stream with Internal instead (the stream outlives its callbacks: its
// destructor synchronizes). cudaStreamAddCallback, not cudaLaunchHostFunc:
// it still runs the callback after a device fault (with the error, which
// fails the stream), where a host function would never run and the actor
// waiting for it would wait until the stall watchdog.
void CudaStream::host_callback(std::function<void()> fn) {
  struct HostFn {
    CudaStream* stream;
    std::function<void()> fn;
  };
  auto* heap = new HostFn{this, std::move(fn)};
  auto run = [](cudaStream_t, cudaError_t status, void* p) {
    std::unique_ptr<HostFn> f(static_cast<HostFn*>(p));
    if (status != cudaSuccess) {
      f->stream->fail(f->stream->async_fault(status, "before a host callback", /*named=*/false));
    }
    f->stream->take_fault();
    try {
      f->fn();
    } catch (const std::exception& ex) {
      f->stream->fail(absl::InternalError(absl::StrCat("host callback: ", ex.what())));
    } catch (...) {
      f->stream->fail(
          absl::InternalError("host callback: an exception that is not a std::exception"));
    }
  };
  if (stream_ == nullptr) {  // (failed when it was made)
    run(nullptr, cudaSuccess, heap);
    return;
  }
  cudaSetDevice(index_);
  check(cudaMemcpyAsync(fault_host_, fault_, 2 * sizeof(unsigned), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync(fault)");
  cudaError_t err = cudaStreamAddCallback(stream_, run, heap, 0);
  if (err != cudaSuccess) {
    // Callbacks still run after errors (the CPU backend's contract): this
    // one now, on the caller's thread, with the failure on the stream.
    check(err, "cudaStreamAddCallback");
    run(stream_, cudaSuccess, heap);
  }
}

void CudaStream::take_fault() {
  if (fault_host_ == nullptr) return;  // (no slot: the stream failed when it was made)
  const auto code = static_cast<Fault>(*static_cast<volatile unsigned*>(fault_host_));
  if (code == Fault::kNone) return;
  const unsigned bound = static_cast<volatile unsigned*>(fault_host_)[1];
  fail(absl::InvalidArgumentError(
      absl::StrCat(fault_op(code), ": ", fault_what(code), " is outside [0, ", bound, ")")));
}

absl::Status CudaStream::synchronize() {
  cudaSetDevice(index_);
  cudaError_t err =
      cudaMemcpyAsync(fault_host_, fault_, 2 * sizeof(unsigned), cudaMemcpyDeviceToHost, stream_);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
  if (err != cudaSuccess) {
    fail(async_fault(err, "at a synchronisation"));
  } else {
    take_fault();
    retire(/*all=*/false);  // by event: ops other threads enqueued since stay held
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    recent_.clear();
  }
  device_.free_deferred();
  return status();
}

absl::Status CudaStream::status() {
  take_fault();
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void CudaStream::fail(absl::Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = std::move(error);
}

void CudaStream::retire(bool all) {
  std::deque<InFlight> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!in_flight_.empty() && (all || cudaEventQuery(in_flight_.front().done) == cudaSuccess)) {
      if (in_flight_.front().start == nullptr) free_events_.push_back(in_flight_.front().done);
      done.push_back(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
  }
  // (Timed ops' events go to times_, which pools them.)
  for (const InFlight& op : done) {
    if (op.start != nullptr) times_->add(op.name, op.start, op.done);
  }
  // `done` drops its storages here, outside the lock.
}

absl::StatusOr<Gemm> CudaStream::gemm() {
  std::shared_ptr<Storage> ws;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ws = workspace_;
  }
  if (ws == nullptr) {
    try {
      ws = device_.allocate(kWorkspaceBytes);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("no device memory for the cuBLASLt workspace");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (workspace_ == nullptr) workspace_ = ws;
    ws = workspace_;
  }
  return Gemm{device_.lt_api(), device_.lt(), ws->data, kWorkspaceBytes, tf32_};
}

Tensor CudaStream::scratch(std::size_t bytes) {
  std::int64_t n = static_cast<std::int64_t>((bytes + sizeof(double) - 1) / sizeof(double));
  n = std::max<std::int64_t>(n, 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (scratch_.defined() && scratch_.numel() >= n) return scratch_.view(0, {n});
  }
  Tensor grown;
  try {
    grown = Tensor::empty(device_, DType::kF64, {n});
  } catch (const std::bad_alloc&) {
    fail(absl::ResourceExhaustedError(
        absl::StrCat("no device memory for ", bytes, " bytes of an op's scratch")));
    return Tensor{};  // the op is then skipped: the stream has failed
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!scratch_.defined() || scratch_.numel() < n) scratch_ = grown;
  return scratch_.view(0, {n});
}

// The op's tensors are held whatever its launch returned: a launch that
// failed part-way may have enqueued kernels that read them.
void CudaStream::run_op(const char* name, absl::Span<const Tensor* const> args,
                        const std::function<absl::Status(const Launch&)>& launch) {
  if (!status().ok()) return;
  std::vector<std::shared_ptr<Storage>> held;
  for (const Tensor* t : args) {
    if (t->defined()) held.push_back(t->storage);
  }
  launch_held(name, std::move(held), launch);
}

// Made whatever the stream's state (gpu/device.h): a collective skipped on
// one member would leave the others waiting in theirs.
void CudaStream::device_call(const char* name, std::vector<Tensor> held,
                             std::function<absl::Status(void* native_stream)> call) {
  std::vector<std::shared_ptr<Storage>> storages;
  for (const Tensor& t : held) {
    if (t.defined()) storages.push_back(t.storage);
  }
  launch_held(name, std::move(storages),
              [&call](const Launch& l) { return call(static_cast<void*>(l.stream)); });
}

void CudaStream::launch_held(const char* name, std::vector<std::shared_ptr<Storage>> held,
                             const std::function<absl::Status(const Launch&)>& launch) {
  if (stream_ == nullptr) return;  // (failed when it was made; nothing launched, nothing held)
  cudaSetDevice(index_);
  retire(/*all=*/false);
  (void)cudaGetLastError();  // a launch reports its own error, not an earlier call's
  // What is left is sticky: an earlier kernel's fault, which every launch
  // would now return as its own. Said as what it is, and nothing launched.
  if (const cudaError_t sticky = cudaPeekAtLastError(); sticky != cudaSuccess) {
    fail(async_fault(sticky, absl::StrCat("before ", name)));
    return;
  }
  cudaEvent_t start = nullptr;
  if (times_ != nullptr) {
    times_->started(stream_);
    start = times_->event();
    if (start != nullptr && cudaEventRecord(start, stream_) != cudaSuccess) {
      times_->give_back(start);
      start = nullptr;
    }
  }
  nvtxRangePushA(name);
  absl::Status st = launch(Launch{stream_, fault_});
  nvtxRangePop();
  if (!st.ok()) {
    if (start != nullptr) times_->give_back(start);  // (a failed launch is not timed)
    start = nullptr;
    fail(absl::Status(st.code(), absl::StrCat(name, ": ", st.message())));
    std::lock_guard<std::mutex> lock(mu_);
    kept_.insert(kept_.end(), held.begin(), held.end());
  }
  InFlight op{nullptr, std::move(held), nullptr, {}};
  if (start != nullptr) {  // timed: both events from times_, which pools them
    op.done = times_->event();
    if (op.done != nullptr) {
      op.start = start;
      op.name = name;
    } else {
      times_->give_back(start);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (op.done == nullptr && !free_events_.empty()) {
      op.done = free_events_.back();
      free_events_.pop_back();
    }
    recent_.emplace_back(name);
    if (recent_.size() > kRecentOps) recent_.pop_front();
  }
  if (op.done == nullptr) {
    check(cudaEventCreateWithFlags(&op.done, cudaEventDisableTiming), "cudaEventCreate");
  }
  const bool recorded = op.done != nullptr && cudaEventRecord(op.done, stream_) == cudaSuccess;
  if (recorded && op.start != nullptr) times_->ended(stream_);
  if (recorded) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.push_back(std::move(op));
  } else {
    // No event to wait for: wait for the op itself before its tensors go.
    check(cudaStreamSynchronize(stream_), name);
    if (op.start != nullptr) {
      times_->add(op.name, op.start, op.done);
    } else if (op.done != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      free_events_.push_back(op.done);
    }
  }
  if (sync_each_op_) {
    cudaError_t err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) fail(cuda_status(err, name));
  }
}

// ---- CudaDevice ----

CudaDevice::CudaDevice(int index) : index_(index), kernels_(make_cuda_kernels()) {}

absl::Status CudaDevice::init() {
  cudaSetDevice(index_);
  absl::Status st = cuda_status(cudaStreamCreateWithFlags(&io_stream_, cudaStreamNonBlocking),
                                "cudaStreamCreate");
  if (st.ok()) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = index_;
    st = cuda_status(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
  }
  if (st.ok()) {
    // Keep freed memory in the pool for reuse instead of returning it at
    // each synchronisation.
    std::uint64_t keep = ~std::uint64_t{0};
    st = cuda_status(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep),
                     "cudaMemPoolSetAttribute");
  }
  if (st.ok()) {
    const std::size_t bytes = 2 * sizeof(unsigned) * kMaxStreams;
    st = cuda_status(cudaMalloc(reinterpret_cast<void**>(&fault_words_), bytes),
                     "cudaMalloc(fault words)");
    if (st.ok()) {
      st = cuda_status(cudaMallocHost(reinterpret_cast<void**>(&fault_words_host_), bytes),
                       "cudaMallocHost(fault words)");
    }
    for (int i = kMaxStreams - 1; i >= 0; i--) free_slots_.push_back(i);
  }
  if (!st.ok()) return st;
  absl::StatusOr<const CublasLt*> lt = load_cublaslt();  // (opened here: gpu/cuda/cublaslt.h)
  if (!lt.ok()) return lt.status();
  const cublasStatus_t bs = (lt_api_ = *lt)->Create(&lt_);
  if (bs == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cublasLtCreate: ", lt_api_->GetStatusString(bs)));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(index_);
  free_deferred();
  {
    std::lock_guard<std::mutex> lock(deferred_->mu);
    for (const auto& [p, bytes] : deferred_->host_free) cudaFreeHost(p);
    deferred_->host_free.clear();
  }
  if (io_stream_ != nullptr) {
    cudaStreamSynchronize(io_stream_);
    cudaStreamDestroy(io_stream_);
  }
  if (lt_ != nullptr) forget_gemm_algorithms(lt_);  // (the algorithms cached for it)
  if (lt_ != nullptr) lt_api_->Destroy(lt_);
  if (fault_words_ != nullptr) cudaFree(fault_words_);
  if (fault_words_host_ != nullptr) cudaFreeHost(fault_words_host_);
  // A pool with live allocations (tensors that outlive their device) stays.
  if (pool_ != nullptr && *live_bytes_ == 0) cudaMemPoolDestroy(pool_);
}

int CudaDevice::take_slot(unsigned** device_word, unsigned** host_word) {
  std::lock_guard<std::mutex> lock(slot_mu_);
  if (free_slots_.empty() || fault_words_ == nullptr || fault_words_host_ == nullptr) return -1;
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  *device_word = fault_words_ + 2 * slot;
  *host_word = fault_words_host_ + 2 * slot;
  return slot;
}

void CudaDevice::release_slot(int slot) {
  std::lock_guard<std::mutex> lock(slot_mu_);
  free_slots_.push_back(slot);
}

std::string CudaDevice::name() const { return absl::StrCat("cuda:", index_); }

void CudaDevice::free_deferred() {
  std::vector<void*> ptrs;
  {
    std::lock_guard<std::mutex> lock(deferred_->mu);
    ptrs.swap(deferred_->ptrs);
  }
  if (ptrs.empty()) return;
  std::lock_guard<std::mutex> lock(io_mu_);
  cudaSetDevice(index_);
  for (void* p : ptrs) cudaFreeAsync(p, io_stream_);
}

std::shared_ptr<Storage> CudaDevice::allocate(std::size_t bytes) {
  free_deferred();
  void* p = nullptr;
  if (bytes != 0) {
    std::lock_guard<std::mutex> lock(io_mu_);
    cudaSetDevice(index_);
    // Ordered after the frees on the same stream; synchronised so that any
    // stream may use the memory at once.
    if (cudaMallocFromPoolAsync(&p, bytes, pool_, io_stream_) != cudaSuccess ||
        cudaStreamSynchronize(io_stream_) != cudaSuccess) {
      throw std::bad_alloc();
    }
  }
  auto s = std::make_shared<Storage>();
  s->data = p;
  s->bytes = bytes;
  s->device = this;
  const auto n = static_cast<std::int64_t>(bytes);
  *live_bytes_ += n;
  // The deleter only queues the pointer: it may run on a CUDA callback thread.
  s->owner = std::shared_ptr<void>(p, [deferred = deferred_, live = live_bytes_, n](void* q) {
    *live -= n;
    if (q == nullptr) return;
    std::lock_guard<std::mutex> lock(deferred->mu);
    deferred->ptrs.push_back(q);
  });
  return s;
}

std::shared_ptr<Storage> CudaDevice::allocate_host(std::size_t bytes) {
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(deferred_->mu);
    auto& pool = deferred_->host_free;
    for (auto it = pool.begin(); it != pool.end(); ++it) {
      if (it->second == bytes) {
        p = it->first;
        pool.erase(it);
        break;
      }
    }
  }
  if (p == nullptr && bytes != 0) {
    std::lock_guard<std::mutex> lock(io_mu_);
    cudaSetDevice(index_);
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) throw std::bad_alloc();
  }
  auto s = std::make_shared<Storage>();
  s->data = p;
  s->bytes = bytes;
  s->device = this;
  s->host = true;
  // As allocate()'s: the deleter may run on a CUDA callback thread.
  s->owner = std::shared_ptr<void>(p, [deferred = deferred_, bytes](void* q) {
    if (q == nullptr) return;
    std::lock_guard<std::mutex> lock(deferred->mu);
    deferred->host_free.emplace_back(q, bytes);
  });
  return s;
}

std::unique_ptr<Stream> CudaDevice::make_stream(StreamOptions o) {
  return std::make_unique<CudaStream>(*this, index_, o.tf32);
}

std::unique_ptr<Event> CudaDevice::make_event() { return std::make_unique<CudaEvent>(index_); }

// Host copies run on the device's own stream and wait for it: a copy from
// pageable memory with plain cudaMemcpy may return before the data has
// landed, and would not be ordered with our non-blocking streams anyway.
absl::Status CudaDevice::copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                              absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(io_mu_);
  cudaSetDevice(index_);
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, io_stream_);
  if (err == cudaSuccess) err = cudaStreamSynchronize(io_stream_);
  return cuda_status(err, what);
}

absl::Status CudaDevice::copy_to_host(const Tensor& src, void* dst) {
  if (src.device() != this) {
    return absl::InvalidArgumentError(absl::StrCat("copy_to_host: not a tensor of ", name()));
  }
  return copy(dst, src.raw(), src.nbytes(), cudaMemcpyDeviceToHost, "copy_to_host");
}

absl::Status CudaDevice::copy_from_host(const void* src, const Tensor& dst) {
  if (dst.device() != this) {
    return absl::InvalidArgumentError(absl::StrCat("copy_from_host: not a tensor of ", name()));
  }
  return copy(dst.raw(), src, dst.nbytes(), cudaMemcpyHostToDevice, "copy_from_host");
}

}  // namespace cuda

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

namespace {

// "" where device `index` can run troupe's kernels, else why not.
std::string unsupported(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess || p.major >= 8) return "";
  return absl::StrCat("cuda:", index, " (", p.name, ") is compute capability ", p.major, ".",
                      p.minor, "; troupe's kernels need 8.0 or newer");
}

}  // namespace

std::string cuda_unsupported_device() {
  for (int i = 0, n = cuda_device_count(); i < n; i++) {
    if (std::string why = unsupported(i); !why.empty()) return why;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Device>> make_cuda_device(int index) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no CUDA device: ", cudaGetErrorString(err)));
  }
  if (index < 0 || index >= n) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", index, " (", n, " present)"));
  }
  if (std::string why = unsupported(index); !why.empty()) return absl::UnavailableError(why);
  auto dev = std::make_unique<cuda::CudaDevice>(index);
  absl::Status st = dev->init();
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("cuda:", index, ": ", st.message()));
  return std::unique_ptr<Device>(std::move(dev));
}

}  // namespace troupe::gpu
