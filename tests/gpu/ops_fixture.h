// The fixture of the cross-backend op tests (ops_test.cc, fused_ops_test.cc):
// a backend and a compute dtype per case, inputs drawn representable in the
// dtype, host copies in double, and the tolerances of each dtype.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gpu/ops.h"
#include "gpu/precision.h"
#include "tests/gpu/backends.h"
#include "tests/gpu/reference_ops.h"
#include "tests/test_util.h"

namespace troupe::gpu {
// ctest names the dtype of a case ("bf16"), not its byte.
inline void PrintTo(DType d, std::ostream* os) { *os << dtype_name(d); }
}  // namespace troupe::gpu

namespace troupe::testing {

using gpu::Accumulate;
using gpu::DType;
using gpu::Tensor;
namespace ops = gpu::ops;

// Norm-wise tolerances against double: fp32 ops; bf16/f16 ops, whose every
// stored value is rounded to 8 (bf16) or 11 (f16) significant bits (relative
// error up to 2^-9 and 2^-12 each, a few roundings per op).
inline double fwd_tol(DType d) { return d == DType::kBF16 ? 1e-2 : d == DType::kF16 ? 2e-3 : 1e-5; }
inline double bwd_tol(DType d) { return d == DType::kBF16 ? 3e-2 : d == DType::kF16 ? 5e-3 : 1e-4; }

// A host copy of the device tensor `t` in f32, after `s` has finished:
// bf16/f16 tensors are converted on the device first (exact).
inline absl::StatusOr<Tensor> host_f32(gpu::Device& dev, gpu::Stream& s, const Tensor& t) {
  Tensor f = t;
  if (t.dtype != DType::kF32) {
    f = Tensor::empty(dev, DType::kF32, t.shape);
    ops::convert(s, f, t);
  }
  if (absl::Status st = s.synchronize(); !st.ok()) return st;
  Tensor h = Tensor::empty(gpu::cpu_device(), DType::kF32, t.shape);
  if (absl::Status st = dev.copy_to_host(f, h.raw()); !st.ok()) return st;
  return h;
}

class OpsTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override {
    dev_ = backend(std::get<0>(GetParam()));
    A_ = std::get<1>(GetParam());
    if (dev_ == nullptr) GTEST_SKIP() << std::get<0>(GetParam()) << ": " << no_cuda_reason();
    stream_ = dev_->make_stream({.threads = 2});
  }
  // A host f32 tensor of N(0, scale^2) values representable in the dtype.
  Tensor rnd(const gpu::Shape& shape, float scale = 1.0f) {
    Tensor t = random_tensor(rng_, shape, scale);
    const gpu::Precision p = gpu::dtype_precision(A_);
    for (std::int64_t i = 0; i < t.numel(); i++) {
      t.data<float>()[i] = gpu::round_to(t.data<float>()[i], p);
    }
    return t;
  }
  // A copy of host f32 tensor `t` on the device, in the dtype (on) or f32
  // (on32); i32 tensors as they are.
  Tensor on32(const Tensor& t) {
    Tensor d = Tensor::empty(*dev_, t.dtype, t.shape);
    EXPECT_TRUE(dev_->copy_from_host(t.raw(), d).ok());
    return d;
  }
  Tensor on(const Tensor& t) {
    Tensor f = on32(t);
    if (t.dtype != DType::kF32 || A_ == DType::kF32) return f;
    Tensor d = Tensor::empty(*dev_, A_, t.shape);
    ops::convert(*stream_, d, f);
    return d;
  }
  Tensor zeros(const gpu::Shape& shape) { return on(filled(shape, 0.0f)); }
  Tensor zeros32(const gpu::Shape& shape) { return on32(filled(shape, 0.0f)); }
  // Host doubles of a device tensor, after the stream has finished. Skips
  // the test when the backend lacks an op that ran.
  Vec host(const Tensor& t) {
    absl::StatusOr<Tensor> h = host_f32(*dev_, *stream_, t);
    if (!h.ok() && absl::IsUnimplemented(h.status())) {
      skipped_ = std::string(h.status().message());
      return Vec(static_cast<std::size_t>(t.numel()), 0.0);
    }
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? to_double(*h) : Vec(static_cast<std::size_t>(t.numel()), 0.0);
  }
  bool unsupported() {
    if (skipped_.empty()) return false;
    std::cout << "[ UNSUPPORTED ] " << skipped_ << "\n";
    return true;
  }
  double fwd_tol() const { return testing::fwd_tol(A_); }
  double bwd_tol() const { return testing::bwd_tol(A_); }
  gpu::Device* dev_ = nullptr;
  DType A_ = DType::kF32;
  std::unique_ptr<gpu::Stream> stream_;
  std::mt19937 rng_{42};
  std::string skipped_;
};

// The optimizer's ops (fp32 master, moments, main gradients) and the
// argument checks' messages, in f32 only.
class Fp32OpsTest : public OpsTest {};

#define SKIP_IF_UNSUPPORTED() \
  if (unsupported()) GTEST_SKIP() << skipped_

// "cpu_bf16", "cuda_f32", ...: gtest_list_tests names each backend and dtype.
inline std::string param_name(
    const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
  return absl::StrCat(std::get<0>(info.param), "_", gpu::dtype_name(std::get<1>(info.param)));
}

}  // namespace troupe::testing
