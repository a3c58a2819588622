// Host and device memory: ops::copy between them on each backend, the host
// tensors (Tensor::empty_host) that hold a device's data for the host, and
// the guard that refuses host reads of memory the host cannot read.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "gpu/host_mirror.h"
#include "gpu/ops.h"
#include "tests/gpu/backends.h"
#ifdef TROUPE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace troupe::testing {
namespace {

class CopyTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dev_ = backend(GetParam());
    if (dev_ == nullptr) GTEST_SKIP() << GetParam() << ": " << no_cuda_reason();
    s_ = dev_->make_stream({.threads = 1});
  }
  gpu::Device* dev_ = nullptr;
  std::unique_ptr<gpu::Stream> s_;
};

// Host -> device -> device (a view) -> host, in stream order, with no
// synchronisation between: the values arrive, and each step ran after the
// one before it.
TEST_P(CopyTest, HostToDeviceToHostInStreamOrder) {
  const std::int64_t n = 1000;
  gpu::Tensor in = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {n});
  gpu::Tensor out = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {n / 2});
  float* p = in.host<float>();
  std::iota(p, p + n, 0.5f);
  gpu::Tensor d = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {n});
  gpu::Tensor e = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {2, n / 4});
  gpu::ops::copy(*s_, d, in);
  gpu::ops::axpy(*s_, d, 1.0f, d);  // d = 2 (i + 0.5), after the copy
  gpu::ops::copy(*s_, e, d.view(n / 2, {n / 2}));
  gpu::ops::copy(*s_, out, e);
  ASSERT_TRUE(s_->synchronize().ok());
  const float* q = out.host<float>();
  for (std::int64_t i = 0; i < n / 2; i++)
    ASSERT_EQ(q[i], 2.0f * (static_cast<float>(n / 2 + i) + 0.5f)) << i;
  // Integers too (tokens), byte for byte.
  gpu::Tensor ti = gpu::Tensor::empty_host(*dev_, gpu::DType::kI32, {3});
  gpu::Tensor to = gpu::Tensor::empty_host(*dev_, gpu::DType::kI32, {3});
  gpu::Tensor td = gpu::Tensor::empty(*dev_, gpu::DType::kI32, {3});
  const std::int32_t v[3] = {-7, 0, 2147483647};
  std::copy(v, v + 3, ti.host<std::int32_t>());
  gpu::ops::copy(*s_, td, ti);
  gpu::ops::copy(*s_, to, td);
  ASSERT_TRUE(s_->synchronize().ok());
  for (int i = 0; i < 3; i++) EXPECT_EQ(to.host<std::int32_t>()[i], v[i]);
}

TEST_P(CopyTest, BadCopiesFailTheStreamNamingTheProblem) {
  gpu::Tensor a = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {4});
  gpu::Tensor b = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {5});
  gpu::ops::copy(*s_, b, a);
  absl::Status st = s_->synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "copy: dst is f32[5], src f32[4]: want the same dtype and element count");

  auto s2 = dev_->make_stream({.threads = 1});
  gpu::Tensor i = gpu::Tensor::empty(*dev_, gpu::DType::kI32, {4});
  gpu::ops::copy(*s2, i, a);
  EXPECT_EQ(s2->synchronize().message(),
            "copy: dst is i32[4], src f32[4]: want the same dtype and element count");

  auto s4 = dev_->make_stream({.threads = 1});
  gpu::Tensor w = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {20});
  gpu::ops::copy(*s4, w.view(0, {10}), w.view(5, {10}));
  EXPECT_EQ(s4->synchronize().message(), "copy: dst and src overlap");

  // Ops take device memory only: a host tensor is refused, on every backend.
  auto s3 = dev_->make_stream({.threads = 1});
  gpu::Tensor h = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {4});
  gpu::ops::fill(*s3, h, 1.0f);
  EXPECT_EQ(s3->synchronize().message(),
            "fill: x is host memory (ops::copy moves it to the device)");
}

TEST_P(CopyTest, HostReadsOnlyWhereTheHostSeesTheMemory) {
  gpu::Tensor d = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {2, 3});
  gpu::Tensor h = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {2, 3});
  EXPECT_TRUE(h.host_readable());
  EXPECT_NE(h.host<float>(), nullptr);
  EXPECT_EQ(d.host_readable(), dev_->host_visible());
  if (dev_->host_visible()) {
    EXPECT_EQ(d.host<float>(), d.data<float>());
  } else {
    try {
      (void)d.view(3, {3}).host<float>();
      ADD_FAILURE() << "a host read of " << dev_->name() << " memory was allowed";
    } catch (const gpu::InvariantError& e) {
      EXPECT_EQ(std::string(e.what()),
                "host read of f32[3] on " + dev_->name() +
                    ", whose memory the host cannot read: copy it with ops::copy into an "
                    "empty_host tensor");
    }
  }
  // Host tensors are not device memory: not counted as the device's.
  const std::int64_t before = dev_->allocated_bytes();
  { gpu::Tensor big = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {1024}); }
  EXPECT_EQ(dev_->allocated_bytes(), before);
}

// A mirror is the tensor itself where the host sees the memory (its copies
// do nothing), else host memory of its own that the copies fill and empty,
// a range at a time, in stream order.
TEST_P(CopyTest, HostMirrorMovesRangesInStreamOrder) {
  gpu::Tensor d = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {2, 4});
  gpu::HostMirror m(d);
  EXPECT_EQ(m.separate(), !dev_->host_visible());
  EXPECT_TRUE(m.host().host_readable());
  EXPECT_EQ(m.host().shape, d.shape);
  float* h = m.host_data<float>();
  for (int i = 0; i < 8; i++) h[i] = static_cast<float>(i);
  m.to_device(*s_);
  gpu::ops::axpy(*s_, d.view(2, {3}), 10.0f, d.view(5, {3}));  // d[2..5) += 10 d[5..8)
  m.to_host(*s_, 2, 3);                                        // only that range back
  ASSERT_TRUE(s_->synchronize().ok());
  const float want[8] = {0, 1, 2 + 50, 3 + 60, 4 + 70, 5, 6, 7};
  for (int i = 0; i < 8; i++) EXPECT_EQ(h[i], want[i]) << i;
  if (m.separate()) {
    h[0] = -1;  // the host's copy alone: the device keeps 0 until copied
    gpu::HostMirror back(d);
    back.to_host(*s_);
    ASSERT_TRUE(s_->synchronize().ok());
    EXPECT_EQ(back.host_data<float>()[0], 0.0f);
  }
}

// A library's device work (what NCCL's collectives are) put on the stream by
// device_call: a device-to-device copy, by cudaMemcpyAsync on the native
// stream on CUDA and by memcpy on the CPU's (null) one.
absl::Status library_copy(void* native, const gpu::Tensor& dst, const gpu::Tensor& src) {
#ifdef TROUPE_HAVE_CUDA
  if (native != nullptr) {
    return cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                           static_cast<cudaStream_t>(native)) == cudaSuccess
               ? absl::OkStatus()
               : absl::InternalError("cudaMemcpyAsync");
  }
#else
  (void)native;
#endif
  std::memcpy(dst.raw(), src.raw(), dst.nbytes());
  return absl::OkStatus();
}

// The call's work runs after the ops before it and before the ops after it;
// the stream's native handle is CUDA's stream there and null on the CPU.
TEST_P(CopyTest, DeviceCallRunsInStreamOrder) {
  const std::int64_t n = 4096;
  gpu::Tensor d = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {n});
  gpu::Tensor e = gpu::Tensor::empty(*dev_, gpu::DType::kF32, {n});
  gpu::Tensor h = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {n});
  bool native_null = false;
  gpu::ops::fill(*s_, e, -1.0f);
  gpu::ops::fill(*s_, d, 3.0f);
  s_->device_call("library copy", {d, e}, [&native_null, d, e](void* native) {
    native_null = native == nullptr;
    return library_copy(native, e, d);
  });
  gpu::ops::axpy(*s_, e, 1.0f, e);  // 6 only if the copy ran first
  gpu::ops::copy(*s_, h, e);
  ASSERT_TRUE(s_->synchronize().ok());
  for (std::int64_t i = 0; i < n; i++) ASSERT_EQ(h.host<float>()[i], 6.0f) << i;
  EXPECT_EQ(native_null, dev_->kind() == gpu::DeviceKind::kCpu);
}

// Made even once the stream has failed (a peer in a collective must not be
// left waiting); an error it returns fails the stream, naming it.
TEST_P(CopyTest, DeviceCallIsMadeAfterAFailureAndFailsTheStreamNamingIt) {
  gpu::Tensor h = gpu::Tensor::empty_host(*dev_, gpu::DType::kF32, {4});
  gpu::ops::fill(*s_, h, 1.0f);  // fails the stream: ops take device memory
  bool made = false;
  s_->device_call("library call", {}, [&made](void*) {
    made = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(s_->synchronize().message(),
            "fill: x is host memory (ops::copy moves it to the device)");
  EXPECT_TRUE(made);

  auto s2 = dev_->make_stream({.threads = 1});
  s2->device_call("TP all-reduce", {},
                  [](void*) { return absl::UnavailableError("member 1 has gone"); });
  absl::Status st = s2->synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "TP all-reduce: member 1 has gone");
}

INSTANTIATE_TEST_SUITE_P(Backends, CopyTest, ::testing::Values("cpu", "opaque", "cuda"));

}  // namespace
}  // namespace troupe::testing
