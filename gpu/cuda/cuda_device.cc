// CudaDevice, CudaStream, CudaEvent on the CUDA runtime API.
#include "gpu/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gpu/kernels.h"

namespace troupe::gpu {
namespace cuda {
cudaError_t launch_fill(float* x, float value, std::int64_t n, cudaStream_t stream);
}

namespace {

absl::Status cuda_status(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

class CudaDevice;

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) : device_(device) {
    cudaSetDevice(device_);
    cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  bool query() override { return cudaEventQuery(event_) == cudaSuccess; }
  void synchronize() override { cudaEventSynchronize(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

class CudaStream final : public Stream {
 public:
  CudaStream(Device& device, int index) : device_(device), index_(index) {
    cudaSetDevice(index_);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaStream() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  Device& device() override { return device_; }
  void record(Event& event) override {
    check(cudaEventRecord(static_cast<CudaEvent&>(event).get(), stream_), "cudaEventRecord");
  }
  void wait(Event& event) override {
    check(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(event).get(), 0),
          "cudaStreamWaitEvent");
  }
  // An exception out of `fn` would end the process on CUDA's callback
  // thread: it fails this stream with Internal instead (the stream outlives
  // its callbacks: its destructor synchronizes).
  void host_callback(std::function<void()> fn) override {
    struct HostFn {
      CudaStream* stream;
      std::function<void()> fn;
    };
    auto* heap = new HostFn{this, std::move(fn)};
    cudaError_t err = cudaLaunchHostFunc(
        stream_,
        [](void* p) {
          std::unique_ptr<HostFn> f(static_cast<HostFn*>(p));
          try {
            f->fn();
          } catch (const std::exception& ex) {
            f->stream->fail(absl::InternalError(absl::StrCat("host callback: ", ex.what())));
          } catch (...) {
            f->stream->fail(absl::InternalError(
                "host callback: an exception that is not a std::exception"));
          }
        },
        heap);
    if (err != cudaSuccess) {
      delete heap;
      check(err, "cudaLaunchHostFunc");
    }
  }
  absl::Status synchronize() override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return status();
  }
  absl::Status status() override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  void fail(absl::Status error) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = std::move(error);
  }
  cudaStream_t get() const { return stream_; }
  void check(cudaError_t err, absl::string_view what) {
    if (err != cudaSuccess) fail(cuda_status(err, what));
  }

 private:
  Device& device_;
  int index_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  absl::Status error_;
};

class CudaKernels final : public Kernels {
 public:
  void fill(Stream& s, const Tensor& x, float value) override {
    auto& cs = static_cast<CudaStream&>(s);
    cs.check(cuda::launch_fill(x.data<float>(), value, x.numel(), cs.get()), "fill");
  }
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {}
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  int index() const override { return index_; }
  std::string name() const override { return absl::StrCat("cuda:", index_); }

  std::shared_ptr<Storage> allocate(std::size_t bytes) override {
    cudaSetDevice(index_);
    void* p = nullptr;
    if (bytes != 0 && cudaMalloc(&p, bytes) != cudaSuccess) throw std::bad_alloc();
    auto s = std::make_shared<Storage>();
    s->data = p;
    s->bytes = bytes;
    s->device = this;
    const auto n = static_cast<std::int64_t>(bytes);
    *live_bytes_ += n;
    s->owner = std::shared_ptr<void>(p, [live = live_bytes_, n](void* q) {
      if (q != nullptr) cudaFree(q);
      *live -= n;
    });
    return s;
  }
  std::int64_t allocated_bytes() const override { return live_bytes_->load(); }
  std::unique_ptr<Stream> make_stream(StreamOptions) override {
    return std::make_unique<CudaStream>(*this, index_);
  }
  std::unique_ptr<Event> make_event() override { return std::make_unique<CudaEvent>(index_); }
  absl::Status copy_to_host(const Tensor& src, void* dst) override {
    cudaSetDevice(index_);
    return cuda_status(cudaMemcpy(dst, src.raw(), src.nbytes(), cudaMemcpyDeviceToHost),
                       "copy_to_host");
  }
  absl::Status copy_from_host(const void* src, const Tensor& dst) override {
    cudaSetDevice(index_);
    return cuda_status(cudaMemcpy(dst.raw(), src, dst.nbytes(), cudaMemcpyHostToDevice),
                       "copy_from_host");
  }
  Kernels& kernels() override { return kernels_; }

 private:
  int index_;
  CudaKernels kernels_;
  std::shared_ptr<std::atomic<std::int64_t>> live_bytes_ =
      std::make_shared<std::atomic<std::int64_t>>(0);
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
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
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(index));
}

}  // namespace troupe::gpu
