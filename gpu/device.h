// Devices, streams and events: the execution model every backend implements.
//
// A Device allocates storage and makes Streams and Events. A Stream runs the
// ops enqueued on it in order, asynchronously to the host; an Event marks a
// point in a stream that another stream can wait for or the host can query. A
// host callback runs once all earlier work on its stream is done: that is how
// an actor learns that its work has finished.
//
// Errors are sticky per stream, as in CUDA: an op whose preconditions fail
// records the error on its stream, later ops on that stream are skipped, and
// synchronize() returns the first error.
//
//   gpu::Device& dev = gpu::cpu_device();
//   std::unique_ptr<gpu::Stream> s = dev.make_stream({.threads = 2});
//   gpu::ops::gelu_forward(*s, out, inp);
//   gpu::Tensor h = gpu::Tensor::empty_host(dev, gpu::DType::kF32, out.shape);
//   gpu::ops::copy(*s, h, out);                 // device to host, in stream order
//   s->host_callback([&] { notify(); });
//   absl::Status st = s->synchronize();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu/tensor.h"

namespace troupe::gpu {

class Kernels;

enum class DeviceKind { kCpu, kCuda };

struct StreamOptions {
  // CPU: worker threads of this stream's op team (OpenMP); 0 = all cores.
  // Fixed per stream so that runs are repeatable. Ignored by CUDA.
  int threads = 0;
  // CUDA: fp32 GEMMs may round their inputs to TF32 on the tensor cores
  // (--tf32, PyTorch's allow_tf32); otherwise they are IEEE fp32. Ignored
  // by the CPU, whose fp32 GEMMs are IEEE.
  bool tf32 = false;
};

class Event {
 public:
  virtual ~Event() = default;
  // True once the work recorded before this event has completed.
  virtual bool query() = 0;
  // Blocks the host until the event has completed.
  virtual void synchronize() = 0;
};

// Opens a gate (Stream::gate): once, from any thread. An error fails the
// stream, so the ops behind the gate are skipped.
using GateOpener = std::function<void(absl::Status)>;

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() = 0;

  // Marks the current end of this stream in `event` (re-recording resets it).
  virtual void record(Event& event) = 0;
  // Work enqueued after this call starts only after `event` has completed.
  virtual void wait(Event& event) = 0;
  // Runs `fn` on a host thread after all earlier work on this stream. `fn`
  // must not block on this stream.
  virtual void host_callback(std::function<void()> fn) = 0;
  // A host_callback for a note of the moment the stream gets here (a trace
  // mark), which orders nothing behind it: a stream that would have to be
  // woken for it (the CPU's, idle with nothing queued: every earlier task
  // is done, so that moment is now) runs it at once on the caller's thread
  // instead. `fn` must be safe on any thread, concurrently with later work,
  // and take no lock the caller holds; what it throws fails the stream.
  virtual void host_note(std::function<void()> fn) { host_callback(std::move(fn)); }
  // Blocks until all enqueued work is done; returns the stream's first error.
  virtual absl::Status synchronize() = 0;
  // A library call that puts device work of its own on this stream (an NCCL
  // collective): `call` gets the stream's native handle (cudaStream_t on
  // CUDA, null on the CPU) and enqueues the work, which then runs after every
  // earlier op and before every later one. On CUDA `call` runs now, on the
  // caller's thread (never inside a host callback, where CUDA forbids it);
  // on the CPU it runs on the stream's thread when the stream gets there, and
  // may wait there for its peers. It is made even after the stream has
  // failed, so that peers in a collective with it are not left waiting. An
  // error it returns fails the stream, naming `name`. `held` stays alive
  // until the work is done.
  virtual void device_call(const char* name, std::vector<Tensor> held,
                           std::function<absl::Status(void* native_stream)> call) = 0;

  // A gate at the current end of this stream: work enqueued after it starts
  // only once the returned opener has been called, by whatever thread has
  // what that work needs (a transport's completion). How an op is put on
  // the stream before its input has arrived, so that its arrival starts it
  // without a hop through the actor. Null where the stream cannot wait for
  // the host without blocking a thread others need (CUDA: its host
  // functions share one thread); has_gates() says. A gate whose openers
  // are all dropped uncalled opens as Cancelled; a stream that has failed,
  // or is being destroyed, goes past a closed gate (skipping the ops
  // behind it, running the rest), so nothing waits on it forever.
  virtual bool has_gates() { return false; }
  virtual GateOpener gate() { return nullptr; }

  // The first error recorded on this stream (OK if none).
  virtual absl::Status status() = 0;
  // Records an error (the first one wins); later ops are skipped.
  virtual void fail(absl::Status error) = 0;
};

// While one lives on a thread, the work this thread enqueues may wait to
// start until the batch ends: a backend whose streams are host threads (the
// CPU's) then wakes an idle stream's thread once for a run of enqueues, not
// once for each (an actor's message handlers, batched over what it handles
// in one go). A blocking wait on this thread (Stream::synchronize,
// Event::synchronize) first wakes what it deferred. Batches nest; the
// outermost one's end wakes. Other backends start work as they enqueue it.
class StreamBatch {
 public:
  StreamBatch();
  ~StreamBatch();
  StreamBatch(const StreamBatch&) = delete;
  StreamBatch& operator=(const StreamBatch&) = delete;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual int index() const = 0;
  virtual std::string name() const = 0;

  // Whether the host may read this device's memory directly (Tensor::host):
  // the CPU, yes; a GPU, no. Code that must run on both copies explicitly.
  virtual bool host_visible() const = 0;

  // Storage of `bytes` bytes, freed when the last view of it goes away.
  // Throws std::bad_alloc when the device is out of memory, as `new` does.
  virtual std::shared_ptr<Storage> allocate(std::size_t bytes) = 0;
  // Host memory this device's streams copy to and from (Storage::host):
  // pinned on CUDA, so that ops::copy is asynchronous. Not counted in
  // allocated_bytes().
  virtual std::shared_ptr<Storage> allocate_host(std::size_t bytes) = 0;
  // Bytes of the storage allocate() has handed out that is still alive (as
  // asked for, before any rounding): memory accounting, e.g. what building
  // one component allocated.
  virtual std::int64_t allocated_bytes() const = 0;
  virtual std::unique_ptr<Stream> make_stream(StreamOptions options) = 0;
  virtual std::unique_ptr<Event> make_event() = 0;

  // Copies between this device's memory and host memory, synchronous (CPU:
  // memcpy; CUDA: on the device's own queue): for setup and checkpoints.
  // Never from a host callback; a step's copies are ops::copy on its stream.
  virtual absl::Status copy_to_host(const Tensor& src, void* dst) = 0;
  virtual absl::Status copy_from_host(const void* src, const Tensor& dst) = 0;

  // The backend's op implementations (gpu/kernels.h).
  virtual Kernels& kernels() = 0;
};

// The process-wide CPU device (the reference backend).
Device& cpu_device();

// A CPU device whose memory the host may not read through Tensor::host(), as
// a GPU's: the same ops, bitwise, but every host read of device data must be
// an explicit ops::copy. Tests run device-aware code on it to show that it
// makes no other, where no GPU is. Must outlive its streams and tensors.
std::unique_ptr<Device> make_opaque_cpu_device();

}  // namespace troupe::gpu
