// Helpers shared by the tests: random tensors, host copies, norm-wise error.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gpu/device.h"
#include "gpu/tensor.h"

namespace troupe::testing {

// A CPU f32 tensor with N(0, scale^2) entries from `rng`.
inline gpu::Tensor random_tensor(std::mt19937& rng, const gpu::Shape& shape, float scale = 1.0f) {
  gpu::Tensor t = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kF32, shape);
  std::normal_distribution<float> d(0.0f, scale);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); i++) p[i] = d(rng);
  return t;
}

inline gpu::Tensor filled(const gpu::Shape& shape, float value) {
  gpu::Tensor t = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kF32, shape);
  for (std::int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = value;
  return t;
}

inline gpu::Tensor int_tensor(const std::vector<std::int32_t>& v, const gpu::Shape& shape) {
  gpu::Tensor t = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kI32, shape);
  for (std::size_t i = 0; i < v.size(); i++) t.data<std::int32_t>()[i] = v[i];
  return t;
}

inline std::vector<double> to_double(const gpu::Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); i++) v[i] = t.data<float>()[i];
  return v;
}

inline gpu::Tensor from_double(const std::vector<double>& v, const gpu::Shape& shape) {
  gpu::Tensor t = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kF32, shape);
  for (std::size_t i = 0; i < v.size(); i++) t.data<float>()[i] = static_cast<float>(v[i]);
  return t;
}

// ||a - b|| / ||b|| (0 when both are 0). Infinite when the sizes differ or
// both are empty, so that comparing nothing never passes a tolerance.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); i++) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

}  // namespace troupe::testing
