// The CPU backend: host memory, and streams that are ordered executors each
// on its own worker thread with a fixed OpenMP team size.
//
// Work enqueued on a CpuStream runs on its worker in FIFO order. Ops are
// skipped once the stream has failed; host callbacks and event records always
// run, so whoever waits on them is told (and then reads the error). The
// worker sleeps when its queue is empty or its next task is a closed gate,
// and is woken only by what lets it go on: work enqueued while it waits for
// work, the gate it waits at opening (or the stream failing). A stream
// failed, or destroyed, at a closed gate passes it: the ops behind it are
// skipped and the control tasks run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/device.h"

namespace troupe::gpu {

class CpuDevice;

// The event's counters live in a shared State that the streams' record
// tasks hold too, so an event may be destroyed while they are queued. A
// stream's wait for work not done yet is a gate in that stream, which the
// record task that completes the work opens: the waiting worker is woken
// once, by the event, not first by the wait's enqueue. (Unlike a receive's
// gate, a failed stream does not pass it; a destroyed one does.)
class CpuEvent final : public Event {
 public:
  bool query() override;
  void synchronize() override;

 private:
  friend class CpuStream;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::uint64_t recorded = 0;   // generations recorded by streams
    std::uint64_t completed = 0;  // generations whose work is done
    // Streams' gates, each opened once `completed` reaches its generation.
    std::vector<std::pair<std::uint64_t, GateOpener>> gates;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

class CpuStream final : public Stream {
 public:
  CpuStream(CpuDevice& device, StreamOptions options);
  ~CpuStream() override;
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  Device& device() override;
  void record(Event& event) override;
  void wait(Event& event) override;
  void host_callback(std::function<void()> fn) override;
  void host_note(std::function<void()> fn) override;
  absl::Status synchronize() override;
  void device_call(const char* name, std::vector<Tensor> held,
                   std::function<absl::Status(void* native_stream)> call) override;
  bool has_gates() override { return true; }
  GateOpener gate() override;
  absl::Status status() override;
  void fail(absl::Status error) override;

  // Enqueues an op; it is skipped if the stream has failed by the time it
  // would run. An exception it (or a host callback) throws, of any type,
  // fails the stream with Internal naming the op; the worker goes on.
  void enqueue_op(const char* name, std::function<void()> op);
  int threads() const { return threads_; }

 private:
  // The queue's lock and the worker's wake-up, shared with the gates'
  // openers and with StreamBatch's deferred wake-ups, which may outlive the
  // stream.
  struct Sync {
    std::mutex mu;
    std::condition_variable cv;
  };
  struct GateState {  // under Sync::mu
    bool open = false;
    absl::Status status;
    // An event's wait: a failed stream still holds there (the work behind
    // it, its control tasks, may touch what the other stream writes).
    bool holds_when_failed = false;
  };
  struct Task {
    Task() = default;
    Task(const char* n, std::function<void()> f) : name(n), fn(std::move(f)) {}
    explicit Task(std::shared_ptr<GateState> g) : gate(std::move(g)) {}
    const char* name = nullptr;  // op name, or nullptr for control tasks
    std::function<void()> fn;
    std::shared_ptr<GateState> gate;  // set: a gate (no fn)
  };
  enum class Waiting { kNo, kWork, kGate };  // what the worker sleeps for
  void enqueue(Task task);
  GateOpener make_gate(bool holds_when_failed);
  void run();

  CpuDevice& device_;
  const int threads_;
  std::shared_ptr<Sync> sync_ = std::make_shared<Sync>();
  std::deque<Task> queue_;  // under sync_->mu, as the fields below
  Waiting waiting_ = Waiting::kNo;
  bool stopping_ = false;
  absl::Status error_;
  std::thread worker_;
};

class CpuDevice final : public Device {
 public:
  // `host_visible` false: the opaque device of make_opaque_cpu_device().
  explicit CpuDevice(bool host_visible = true);
  ~CpuDevice() override;
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  int index() const override { return 0; }
  std::string name() const override { return host_visible_ ? "cpu" : "cpu (opaque)"; }
  bool host_visible() const override { return host_visible_; }
  std::shared_ptr<Storage> allocate(std::size_t bytes) override;
  std::shared_ptr<Storage> allocate_host(std::size_t bytes) override;
  std::int64_t allocated_bytes() const override { return live_bytes_->load(); }
  std::unique_ptr<Stream> make_stream(StreamOptions options) override;
  std::unique_ptr<Event> make_event() override;
  absl::Status copy_to_host(const Tensor& src, void* dst) override;
  absl::Status copy_from_host(const void* src, const Tensor& dst) override;
  Kernels& kernels() override;

 private:
  std::shared_ptr<Storage> allocate_aligned(std::size_t bytes, bool counted);

  const bool host_visible_;
  std::unique_ptr<Kernels> kernels_;
  // Shared with every storage's deleter, which may outlive the device.
  std::shared_ptr<std::atomic<std::int64_t>> live_bytes_ =
      std::make_shared<std::atomic<std::int64_t>>(0);
};

}  // namespace troupe::gpu
