// Tensors as plain data: dtype, shape, strides, storage and device.
//
// A Tensor does not own a stream and does no work; ops in gpu/ops.h do. The
// storage is shared (a view keeps its parent's bytes alive), so an op that is
// enqueued on a stream can hold its arguments until it has run.
//
//   gpu::Device& cpu = gpu::cpu_device();
//   gpu::Tensor x = gpu::Tensor::empty(cpu, gpu::DType::kF32, {B, T, C});
//   gpu::Tensor row = x.view(/*offset=*/0, {T, C});   // x[0]
//   float* p = x.host<float>();   // host code: the CPU's memory, or an empty_host tensor
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/precision.h"

namespace troupe::gpu {

class Device;

// kBF16 and kF16 hold the 16-bit formats' bits (gpu/precision.h).
enum class DType : std::uint8_t { kF32, kF64, kI32, kU16, kBF16, kF16 };

std::size_t dtype_size(DType dtype);
absl::string_view dtype_name(DType dtype);
// The dtypes activations, their gradients and the compute copy of the
// parameters are stored in: f32, bf16, f16.
bool is_compute_dtype(DType dtype);
// The dtype tensors are stored in when computing in `p`, and back.
DType compute_dtype(Precision p);
Precision dtype_precision(DType dtype);  // an is_compute_dtype dtype

using Shape = absl::InlinedVector<std::int64_t, 4>;

std::string shape_string(const Shape& shape);
std::int64_t shape_numel(const Shape& shape);

// Bytes on one device. Freed through the device that allocated them when the
// last tensor viewing them goes away.
struct Storage {
  void* data = nullptr;
  std::size_t bytes = 0;
  Device* device = nullptr;
  std::shared_ptr<void> owner;  // releases `data`
  // Host memory that `device`'s streams copy to and from (Device::
  // allocate_host: pinned on CUDA). The host reads it; ops do not take it.
  bool host = false;
};

struct Tensor {
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // in elements
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements, from storage->data

  // Allocates a contiguous, uninitialised tensor on `device`.
  static Tensor empty(Device& device, DType dtype, const Shape& shape);
  // Wraps caller-owned host memory (no copy; the caller keeps it alive).
  static Tensor wrap_host(void* data, DType dtype, const Shape& shape);
  // Allocates a contiguous host tensor that `device`'s streams copy to and
  // from with ops::copy (pinned memory on CUDA, so the copy is
  // asynchronous): how host code reads and writes device data.
  static Tensor empty_host(Device& device, DType dtype, const Shape& shape);

  bool defined() const { return storage != nullptr; }
  int dim() const { return static_cast<int>(shape.size()); }
  std::int64_t size(int d) const { return shape[d < 0 ? d + dim() : d]; }
  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  Device* device() const { return storage ? storage->device : nullptr; }

  // A contiguous view of `shape` starting `offset` elements into this
  // (contiguous) tensor's data. InvalidArgument, naming both shapes, when
  // this tensor is not contiguous or the view does not fit inside it: the
  // check for views computed from input (files, flags, messages).
  absl::StatusOr<Tensor> try_view(std::int64_t offset_elems, const Shape& shape) const;
  // try_view for views the caller's own invariants make fit. One that does
  // not fit ends the process with try_view's message, in every build type
  // (never a view past the storage, which would be undefined behaviour).
  Tensor view(std::int64_t offset_elems, const Shape& shape) const;
  // A contiguous view of `shape` in another dtype, `byte_offset` bytes into
  // this (contiguous) tensor's data, which must be a multiple of the new
  // dtype's size: how one allocation holds tensors of several dtypes
  // (bf16 activations beside their f32 statistics). Checked as view is.
  Tensor view_as(DType new_dtype, std::int64_t byte_offset, const Shape& shape) const;
  // The same elements with another contiguous shape of equal numel (checked
  // as view is).
  absl::StatusOr<Tensor> try_reshape(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;

  // True when host code may read and write the elements through host():
  // host memory, or memory of a device the host sees (the CPU's).
  bool host_readable() const;
  // The elements, for host code. A tensor in memory the host cannot read (a
  // GPU's) throws InvariantError naming it: such data reaches the host only
  // through an explicit copy on a stream (ops::copy into an empty_host
  // tensor), never by a read that would race the device.
  template <typename T>
  T* host() const {
    if (!host_readable()) throw_not_host_readable();
    return data<T>();
  }
  // The elements' address on their device: for kernels and for transports
  // that take device memory. Host code uses host().
  template <typename T>
  T* data() const {
    return reinterpret_cast<T*>(static_cast<char*>(storage->data) +
                                offset * static_cast<std::int64_t>(dtype_size(dtype)));
  }
  void* raw() const { return data<char>(); }

  // "f32[4, 64, 512]"
  std::string describe() const;

 private:
  [[noreturn]] void throw_not_host_readable() const;
};

Shape contiguous_strides(const Shape& shape);

// A broken invariant of the caller's own (not bad input, which is a Status).
// Thrown, never an abort of the process: a stream turns it into its sticky
// error and an actor's exception handler into a failure the coordinator
// reports, so one rank's bug stops the job with a message naming it.
class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};
// When `st` is not OK, throws InvariantError("internal error in <where>:
// <message>"), in every build type.
void check_invariant(const absl::Status& st, const char* where);

}  // namespace troupe::gpu
