// CpuDevice, CpuStream and CpuEvent.
#include "gpu/cpu/cpu_device.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>

#include "absl/strings/str_cat.h"
#include "gpu/kernels.h"

namespace troupe::gpu {

std::unique_ptr<Kernels> make_cpu_kernels();  // cpu_ops.cc

// ---- CpuEvent ---------------------------------------------------------------

bool CpuEvent::query() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed >= state_->recorded;
}

void CpuEvent::synchronize() {
  State& e = *state_;
  std::unique_lock<std::mutex> lock(e.mu);
  const std::uint64_t target = e.recorded;
  e.cv.wait(lock, [&] { return e.completed >= target; });
}

// ---- CpuStream --------------------------------------------------------------

// At most OMP_THREAD_LIMIT threads: with a larger omp_set_num_threads()
// the team is cut to the limit, but oneDNN 2.6's sgemm partitions the product
// among omp_get_max_threads() threads and the missing ones' blocks are never
// computed (a silently wrong GEMM).
CpuStream::CpuStream(CpuDevice& device, StreamOptions options)
    : device_(device),
      threads_(std::min(options.threads > 0 ? options.threads : omp_get_num_procs(),
                        omp_get_thread_limit())),
      worker_([this] { run(); }) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

Device& CpuStream::device() { return device_; }

void CpuStream::enqueue(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void CpuStream::enqueue_op(const char* name, std::function<void()> op) {
  enqueue({name, std::move(op)});
}

// The tasks hold the event's State, not the event: it may be gone by then.
void CpuStream::record(Event& event) {
  std::shared_ptr<CpuEvent::State> e = static_cast<CpuEvent&>(event).state_;
  std::uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = ++e->recorded;
  }
  // Notified under the lock: a waiter may destroy the event as soon as it
  // sees `completed` (notifying after unlock was a use of a destroyed
  // condition variable, found by ThreadSanitizer); the task holds the
  // event's State, so the event itself may be gone by then.
  enqueue({nullptr, [e, gen] {
             std::lock_guard<std::mutex> lock(e->mu);
             if (e->completed < gen) e->completed = gen;
             e->cv.notify_all();
           }});
}

void CpuStream::wait(Event& event) {
  std::shared_ptr<CpuEvent::State> e = static_cast<CpuEvent&>(event).state_;
  std::uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = e->recorded;
  }
  enqueue({nullptr, [e, target] {
             std::unique_lock<std::mutex> lock(e->mu);
             e->cv.wait(lock, [&] { return e->completed >= target; });
           }});
}

void CpuStream::host_callback(std::function<void()> fn) { enqueue({nullptr, std::move(fn)}); }

// A control task (it runs after a failure too); the tensors go with it.
void CpuStream::device_call(const char* name, std::vector<Tensor> held,
                            std::function<absl::Status(void* native_stream)> call) {
  enqueue({nullptr, [this, name, held = std::move(held), call = std::move(call)] {
             absl::Status st = call(nullptr);
             if (!st.ok()) fail(absl::Status(st.code(), absl::StrCat(name, ": ", st.message())));
           }});
}

absl::Status CpuStream::synchronize() {
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  enqueue({nullptr, [&] {
             std::lock_guard<std::mutex> lock(done_mu);
             done = true;
             done_cv.notify_all();
           }});
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return done; });
  return status();
}

absl::Status CpuStream::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void CpuStream::fail(absl::Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = std::move(error);
}

void CpuStream::run() {
  // The OpenMP team size is a per-thread setting: every parallel region this
  // worker opens (our kernels, oneDNN's GEMMs) uses `threads_` threads.
  omp_set_num_threads(threads_);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and all work done
      task = std::move(queue_.front());
      queue_.pop_front();
      if (task.name != nullptr && !error_.ok()) continue;  // skip ops after an error
    }
    try {
      task.fn();
    } catch (const std::exception& ex) {
      fail(absl::InternalError(
          absl::StrCat(task.name ? task.name : "host callback", ": ", ex.what())));
    } catch (...) {  // an exception leaving this thread would end the process
      fail(absl::InternalError(absl::StrCat(task.name ? task.name : "host callback",
                                            ": an exception that is not a std::exception")));
    }
  }
}

// ---- CpuDevice --------------------------------------------------------------

CpuDevice::CpuDevice(bool host_visible)
    : host_visible_(host_visible), kernels_(make_cpu_kernels()) {}
CpuDevice::~CpuDevice() = default;

std::shared_ptr<Storage> CpuDevice::allocate(std::size_t bytes) {
  return allocate_aligned(bytes, /*counted=*/true);
}

std::shared_ptr<Storage> CpuDevice::allocate_host(std::size_t bytes) {
  std::shared_ptr<Storage> s = allocate_aligned(bytes, /*counted=*/false);
  s->host = true;
  return s;
}

std::shared_ptr<Storage> CpuDevice::allocate_aligned(std::size_t bytes, bool counted) {
  // 64-byte alignment: whole cache lines and AVX-512 vectors.
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
  if (rounded != 0 && p == nullptr) throw std::bad_alloc();
  auto s = std::make_shared<Storage>();
  s->data = p;
  s->bytes = bytes;
  s->device = this;
  const auto n = counted ? static_cast<std::int64_t>(bytes) : 0;
  *live_bytes_ += n;
  s->owner = std::shared_ptr<void>(p, [live = live_bytes_, n](void* q) {
    std::free(q);
    *live -= n;
  });
  return s;
}

std::unique_ptr<Stream> CpuDevice::make_stream(StreamOptions options) {
  return std::make_unique<CpuStream>(*this, options);
}

std::unique_ptr<Event> CpuDevice::make_event() { return std::make_unique<CpuEvent>(); }

absl::Status CpuDevice::copy_to_host(const Tensor& src, void* dst) {
  if (src.device() != this) return absl::InvalidArgumentError("copy_to_host: not a CPU tensor");
  std::memcpy(dst, src.raw(), src.nbytes());
  return absl::OkStatus();
}

absl::Status CpuDevice::copy_from_host(const void* src, const Tensor& dst) {
  if (dst.device() != this) {
    return absl::InvalidArgumentError("copy_from_host: not a CPU tensor");
  }
  std::memcpy(dst.raw(), src, dst.nbytes());
  return absl::OkStatus();
}

Kernels& CpuDevice::kernels() { return *kernels_; }

Device& cpu_device() {
  static CpuDevice* device = new CpuDevice();  // never destroyed: outlives every stream
  return *device;
}

std::unique_ptr<Device> make_opaque_cpu_device() {
  return std::make_unique<CpuDevice>(/*host_visible=*/false);
}

}  // namespace troupe::gpu
