// Tensor construction, views and descriptions.
#include "gpu/tensor.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu/device.h"

namespace troupe::gpu {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kU16:
      return 2;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 0;
}

absl::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kU16:
      return "u16";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "?";
}

bool is_compute_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return DType::kF32;
    case Precision::kBf16:
      return DType::kBF16;
    case Precision::kFp16:
      return DType::kF16;
  }
  return DType::kF32;
}

Precision dtype_precision(DType dtype) {
  return dtype == DType::kBF16  ? Precision::kBf16
         : dtype == DType::kF16 ? Precision::kFp16
                                : Precision::kFp32;
}

std::string shape_string(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

namespace {

// A contiguous tensor of `shape`, with no storage yet.
Tensor contiguous(DType dtype, const Shape& shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = contiguous_strides(shape);
  return t;
}

}  // namespace

Tensor Tensor::empty(Device& device, DType dtype, const Shape& shape) {
  Tensor t = contiguous(dtype, shape);
  t.storage = device.allocate(t.nbytes());
  return t;
}

Tensor Tensor::wrap_host(void* data, DType dtype, const Shape& shape) {
  Tensor t = contiguous(dtype, shape);
  t.storage = std::make_shared<Storage>();
  t.storage->data = data;
  t.storage->bytes = t.nbytes();
  t.storage->device = &cpu_device();
  return t;
}

Tensor Tensor::empty_host(Device& device, DType dtype, const Shape& shape) {
  Tensor t = contiguous(dtype, shape);
  t.storage = device.allocate_host(t.nbytes());
  return t;
}

bool Tensor::host_readable() const {
  return storage != nullptr &&
         (storage->host || storage->device == nullptr || storage->device->host_visible());
}

void Tensor::throw_not_host_readable() const {
  if (!defined()) throw InvariantError("host read of an undefined tensor");
  throw InvariantError(absl::StrCat(
      "host read of ", describe(), " on ",
      device() != nullptr ? device()->name() : std::string("no device"),
      ", whose memory the host cannot read: copy it with ops::copy into an empty_host tensor"));
}

bool Tensor::is_contiguous() const { return strides == contiguous_strides(shape); }

void check_invariant(const absl::Status& st, const char* where) {
  if (st.ok()) return;
  throw InvariantError(absl::StrCat("internal error in ", where, ": ", st.message()));
}

absl::StatusOr<Tensor> Tensor::try_view(std::int64_t offset_elems, const Shape& new_shape) const {
  if (!is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("view of ", describe(), ": the tensor is not contiguous"));
  }
  std::int64_t n = 1;
  for (std::int64_t d : new_shape) {
    if (d < 0 || (d > 0 && n > numel() / d)) {  // also keeps n from overflowing
      return absl::InvalidArgumentError(
          absl::StrCat("view ", shape_string(new_shape), " of ", describe(), ": does not fit"));
    }
    n *= d;
  }
  if (offset_elems < 0 || offset_elems > numel() - n) {
    return absl::InvalidArgumentError(absl::StrCat("view ", shape_string(new_shape), " at offset ",
                                                   offset_elems, " of ", describe(),
                                                   ": does not fit"));
  }
  Tensor t = *this;
  t.shape = new_shape;
  t.strides = contiguous_strides(new_shape);
  t.offset = offset + offset_elems;
  return t;
}

Tensor Tensor::view(std::int64_t offset_elems, const Shape& new_shape) const {
  absl::StatusOr<Tensor> t = try_view(offset_elems, new_shape);
  check_invariant(t.status(), "Tensor::view");
  return *std::move(t);
}

Tensor Tensor::view_as(DType new_dtype, std::int64_t byte_offset, const Shape& new_shape) const {
  const auto size = static_cast<std::int64_t>(dtype_size(new_dtype));
  const std::int64_t n = shape_numel(new_shape);
  absl::Status st;
  if (!is_contiguous()) {
    st = absl::InvalidArgumentError(absl::StrCat("view of ", describe(), ": not contiguous"));
  } else if (byte_offset < 0 || byte_offset % size != 0 ||
             (offset * static_cast<std::int64_t>(dtype_size(dtype))) % size != 0 || n < 0 ||
             byte_offset + n * size > static_cast<std::int64_t>(nbytes())) {
    st = absl::InvalidArgumentError(absl::StrCat("view ", dtype_name(new_dtype),
                                                 shape_string(new_shape), " at byte ", byte_offset,
                                                 " of ", describe(), ": does not fit"));
  }
  check_invariant(st, "Tensor::view_as");
  Tensor t = *this;
  t.dtype = new_dtype;
  t.shape = new_shape;
  t.strides = contiguous_strides(new_shape);
  t.offset = (offset * static_cast<std::int64_t>(dtype_size(dtype)) + byte_offset) / size;
  return t;
}

absl::StatusOr<Tensor> Tensor::try_reshape(const Shape& new_shape) const {
  if (shape_numel(new_shape) != numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reshape of ", describe(), " to ", shape_string(new_shape), ": the element counts differ"));
  }
  return try_view(0, new_shape);
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  absl::StatusOr<Tensor> t = try_reshape(new_shape);
  check_invariant(t.status(), "Tensor::reshape");
  return *std::move(t);
}

std::string Tensor::describe() const {
  return absl::StrCat(dtype_name(dtype), shape_string(shape));
}

}  // namespace troupe::gpu
