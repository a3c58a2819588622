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
#include "gpu/thread_name.h"

namespace troupe::gpu {

std::unique_ptr<Kernels> make_cpu_kernels();  // cpu_ops.cc

// ---- StreamBatch ------------------------------------------------------------

namespace {

// This thread's batches, and the workers their enqueues did not wake yet
// (each stream's condition variable, held through its shared Sync).
struct DeferredWakes {
  int depth = 0;
  std::vector<std::shared_ptr<std::condition_variable>> cvs;
};
thread_local DeferredWakes deferred;

void wake_deferred() {
  std::vector<std::shared_ptr<std::condition_variable>> cvs;
  cvs.swap(deferred.cvs);
  for (const auto& cv : cvs) cv->notify_one();
}

}  // namespace

StreamBatch::StreamBatch() { deferred.depth++; }

StreamBatch::~StreamBatch() {
  if (--deferred.depth == 0) wake_deferred();
}

// ---- CpuEvent ---------------------------------------------------------------

bool CpuEvent::query() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed >= state_->recorded;
}

void CpuEvent::synchronize() {
  wake_deferred();  // (this thread's StreamBatch may hold back the work it waits for)
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
    std::lock_guard<std::mutex> lock(sync_->mu);
    stopping_ = true;
  }
  sync_->cv.notify_all();
  worker_.join();
}

Device& CpuStream::device() { return device_; }

// Wakes the worker only where the task lets it go on: it waits for work,
// and the task is not a closed gate (whose opening wakes it).
void CpuStream::enqueue(Task task) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(sync_->mu);
    wake = waiting_ == Waiting::kWork && queue_.empty() && !(task.gate && !task.gate->open);
    queue_.push_back(std::move(task));
  }
  if (!wake) return;
  if (deferred.depth == 0) return sync_->cv.notify_one();
  // (A worker waiting for work has an empty queue: the batch meets it once.)
  deferred.cvs.emplace_back(sync_, &sync_->cv);
}

namespace {

// What a gate's openers share: the first call opens the gate; if none is
// ever made (a callback dropped uncalled), the last copy's end opens it
// with Cancelled, so no stream waits for an opener that is gone.
template <typename Sync, typename GateState>
class Opener {
 public:
  Opener(std::shared_ptr<GateState> g, std::weak_ptr<Sync> sync)
      : gate_(std::move(g)), sync_(std::move(sync)) {}
  ~Opener() { open(absl::CancelledError("the input this op waited for will never come")); }
  Opener(const Opener&) = delete;
  Opener& operator=(const Opener&) = delete;
  void open(absl::Status st) {
    std::shared_ptr<Sync> sync = sync_.lock();
    if (!sync) return;  // the stream is gone, and the work behind the gate with it
    {
      std::lock_guard<std::mutex> lock(sync->mu);
      if (gate_->open) return;
      gate_->open = true;
      gate_->status = std::move(st);
    }
    // (Only the worker waits on it. A worker asleep for another reason
    // looks again and sleeps on.)
    sync->cv.notify_one();
  }

 private:
  std::shared_ptr<GateState> gate_;
  std::weak_ptr<Sync> sync_;
};

}  // namespace

GateOpener CpuStream::gate() { return make_gate(false); }

GateOpener CpuStream::make_gate(bool holds_when_failed) {
  auto g = std::make_shared<GateState>();
  g->holds_when_failed = holds_when_failed;
  auto opener = std::make_shared<Opener<Sync, GateState>>(g, sync_);  // (before: it may throw)
  enqueue(Task(g));
  return [opener](absl::Status st) { opener->open(std::move(st)); };
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
             std::vector<GateOpener> open;
             {
               std::lock_guard<std::mutex> lock(e->mu);
               if (e->completed < gen) e->completed = gen;
               e->cv.notify_all();
               auto done = [&](const auto& g) { return g.first <= e->completed; };
               for (auto& g : e->gates) {
                 if (done(g)) open.push_back(std::move(g.second));
               }
               std::erase_if(e->gates, done);
             }
             for (GateOpener& o : open) o(absl::OkStatus());  // (outside the lock)
           }});
}

// A wait for work that is done already orders nothing: it is not queued,
// so it wakes no worker (an actor that hears of an event once its stream
// is past it, and then orders its own stream after it, costs no hand-off).
void CpuStream::wait(Event& event) {
  std::shared_ptr<CpuEvent::State> e = static_cast<CpuEvent&>(event).state_;
  std::uint64_t target;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = e->recorded;
    if (e->completed >= target) return;
  }
  GateOpener open = make_gate(true);  // (not under the event's lock: enqueue takes the stream's)
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->completed < target) {
      e->gates.emplace_back(target, std::move(open));
      return;
    }
  }
  open(absl::OkStatus());  // done in between
}

void CpuStream::host_callback(std::function<void()> fn) { enqueue({nullptr, std::move(fn)}); }

// Queued wherever the worker will come to it without a wake-up: it is
// running a task, or has some queued (or is held at a gate, which is
// queued). Only a worker asleep on an empty queue would be woken for it.
void CpuStream::host_note(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(sync_->mu);
    if (waiting_ != Waiting::kWork || !queue_.empty()) {
      queue_.push_back({nullptr, std::move(fn)});
      return;
    }
  }
  try {  // (as the worker runs a host callback)
    fn();
  } catch (const std::exception& ex) {
    fail(absl::InternalError(absl::StrCat("host note: ", ex.what())));
  } catch (...) {
    fail(absl::InternalError("host note: an exception that is not a std::exception"));
  }
}

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
  wake_deferred();
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return done; });
  return status();
}

absl::Status CpuStream::status() {
  std::lock_guard<std::mutex> lock(sync_->mu);
  return error_;
}

// (A worker at a closed gate goes on: a failed stream skips the ops behind
// it anyway, and runs the control tasks there at once.)
void CpuStream::fail(absl::Status error) {
  {
    std::lock_guard<std::mutex> lock(sync_->mu);
    if (!error_.ok()) return;
    error_ = std::move(error);
  }
  sync_->cv.notify_one();
}

void CpuStream::run() {
  name_this_thread("stream");
  // The OpenMP team size is a per-thread setting: every parallel region this
  // worker opens (our kernels, oneDNN's GEMMs) uses `threads_` threads.
  omp_set_num_threads(threads_);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(sync_->mu);
      for (;;) {
        // A closed gate holds the worker, unless the stream has failed (the
        // ops behind it are skipped) or is being destroyed (they are
        // skipped, the control tasks run, as after an error).
        const bool closed = !queue_.empty() && queue_.front().gate && !queue_.front().gate->open &&
                            (error_.ok() || queue_.front().gate->holds_when_failed) && !stopping_;
        if (!queue_.empty() && !closed) break;
        if (stopping_) return;  // all work done
        waiting_ = closed ? Waiting::kGate : Waiting::kWork;
        sync_->cv.wait(lock);
        waiting_ = Waiting::kNo;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      if (task.gate) {  // an error it was opened with fails the stream
        if (!task.gate->open && error_.ok()) {
          error_ = absl::CancelledError("the stream was destroyed at a gate never opened");
        }
        if (task.gate->open && !task.gate->status.ok() && error_.ok()) {
          error_ = task.gate->status;
        }
        continue;
      }
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
