// The TP collectives as device calls on the stream (actors/rank/tensor_link.h).
#include "actors/rank/tensor_link.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/ops.h"

namespace troupe::actors {
namespace {

using comm::trace::What;

// A device call of a collective (`run`, given the native stream), holding
// `held`; a failure fails the stream, naming `what`.
void device_call(gpu::Stream& s, const CollectiveRunner& runner, What op, const char* what,
                 std::size_t floats, std::vector<gpu::Tensor> held,
                 std::function<absl::Status(void*)> run) {
  s.device_call(what, std::move(held),
                [runner, op, floats, run = std::move(run)](void* native) -> absl::Status {
                  auto call = [&] { return run(native); };
                  return runner ? runner(op, floats, call) : call();
                });
}

// The Communicator's collectives where a device call runs on the stream's
// thread (the CPU backend): each waits there for the peers. A failure is
// Unavailable (a member is gone, or the run is over).
class InStream final : public comm::StreamCollectives {
 public:
  explicit InStream(comm::Communicator* comm) : comm_(comm) {}
  absl::Status all_reduce_on(void* stream, float* data, std::size_t n) override {
    if (stream != nullptr) return not_cpu();
    return unavailable(comm_->all_reduce_sync(data, n));
  }
  absl::Status reduce_scatter_on(void* stream, const float* in, float* out,
                                 std::size_t n) override {
    if (stream != nullptr) return not_cpu();
    return unavailable(comm_->reduce_scatter_sync(in, out, n));
  }
  absl::Status all_gather_on(void* stream, const float* in, float* out, std::size_t n) override {
    if (stream != nullptr) return not_cpu();
    return unavailable(comm_->all_gather_sync(in, out, n));
  }
  absl::Status reduce_on(void* stream, const float* in, float* out, std::size_t n,
                         int root) override {
    if (stream != nullptr) return not_cpu();
    return unavailable(comm_->reduce_sync(in, out, n, root));
  }
  // The Communicator broadcasts floats: bytes that are not whole, aligned
  // floats (a bf16 piece) travel in a float buffer of their own.
  absl::Status broadcast_on(void* stream, const void* in, void* out, std::size_t bytes,
                            int root) override {
    if (stream != nullptr) return not_cpu();
    const bool root_here = comm_->rank() == root;
    if (bytes % sizeof(float) == 0 && reinterpret_cast<std::uintptr_t>(out) % alignof(float) == 0) {
      if (root_here && in != out && bytes > 0) std::memcpy(out, in, bytes);
      return unavailable(comm_->broadcast_sync(static_cast<float*>(out), bytes / 4, root));
    }
    std::vector<float> buf((bytes + 3) / 4, 0.0f);
    if (root_here && bytes > 0) std::memcpy(buf.data(), in, bytes);
    absl::Status st = comm_->broadcast_sync(buf.data(), buf.size(), root);
    if (st.ok() && bytes > 0) std::memcpy(out, buf.data(), bytes);
    return unavailable(st);
  }

 private:
  static absl::Status unavailable(const absl::Status& st) {
    return st.ok() ? st : absl::UnavailableError(st.message());
  }
  static absl::Status not_cpu() {
    return absl::InternalError(
        "the Communicator's collectives on a stream that is not the CPU's (a GPU's needs "
        "NCCL's)");
  }
  comm::Communicator* comm_;
};

// fp32 buffers, two per stream, for the collectives of bf16/fp16 tensors:
// in() widens a tensor into buffer k, scratch() is buffer k in a tensor's
// shape, out() rounds a buffer back into the tensor, each in stream order.
// An f32 tensor is its own buffer. A buffer that grows is a new one; the
// ops enqueued on the old one hold it until they have run.
class F32Buffers {
 public:
  // Buffer k of at least n floats on `s`, now.
  void reserve(gpu::Stream& s, int k, std::int64_t n) {
    if (n > 0) (void)get(s, {n}, k);
  }
  gpu::Tensor in(gpu::Stream& s, const gpu::Tensor& x, int k) {
    if (x.dtype == gpu::DType::kF32) return x;
    const gpu::Tensor f = get(s, x.shape, k);
    gpu::ops::convert(s, f, x);
    return f;
  }
  gpu::Tensor scratch(gpu::Stream& s, const gpu::Tensor& x, int k) {
    return x.dtype == gpu::DType::kF32 ? x : get(s, x.shape, k);
  }
  void out(gpu::Stream& s, const gpu::Tensor& x, const gpu::Tensor& f) {
    if (x.dtype != gpu::DType::kF32) gpu::ops::convert(s, x, f);
  }

 private:
  gpu::Tensor get(gpu::Stream& s, const gpu::Shape& shape, int k) {
    const std::int64_t n = std::max<std::int64_t>(1, gpu::shape_numel(shape));
    std::lock_guard<std::mutex> lock(mu_);
    gpu::Tensor& b = bufs_[&s][static_cast<std::size_t>(k)];
    if (!b.defined() || b.numel() < n) b = gpu::Tensor::empty(s.device(), gpu::DType::kF32, {n});
    return b.view(0, shape);
  }
  std::mutex mu_;
  std::map<gpu::Stream*, std::array<gpu::Tensor, 2>> bufs_;
};

// The link over `comm`; `keep` (may be null) lives as long as the link.
model::TensorParallel link(comm::StreamCollectives* comm, std::shared_ptr<void> keep,
                           model::TpSlice slice, const TensorLinkOptions& options) {
  model::TensorParallel tp;
  tp.slice = slice;
  auto count = [counter = options.reduced_floats](std::int64_t n) {
    if (counter) *counter += n;
  };
  // The collectives sum fp32. A bf16/fp16 tensor (the activations and
  // their gradients) is widened into an fp32 buffer of the stream's, summed
  // there in the group's fixed order, and rounded once on the way back:
  // every peer gets the same bits, and no partial sum is rounded.
  auto widened = std::make_shared<F32Buffers>();
  if (options.stream != nullptr) {
    for (int k = 0; k < 2; k++) widened->reserve(*options.stream, k, options.reserve_floats[k]);
  }
  tp.all_reduce = [comm, keep, count, widened, runner = options.runner](gpu::Stream& s,
                                                                        const gpu::Tensor& x) {
    count(x.numel());
    const auto n = static_cast<std::size_t>(x.numel());
    const gpu::Tensor f = widened->in(s, x, 0);
    device_call(s, runner, What::kAllReduce, "TP all-reduce", n, {f},
                [comm, f, n](void* ns) { return comm->all_reduce_on(ns, f.data<float>(), n); });
    widened->out(s, x, f);
  };
  tp.all_gather = [comm, keep, widened, runner = options.runner](
                      gpu::Stream& s, const gpu::Tensor& in, const gpu::Tensor& out) {
    const auto n = static_cast<std::size_t>(out.numel());
    const gpu::Tensor fi = widened->in(s, in, 0), fo = widened->scratch(s, out, 1);
    device_call(s, runner, What::kAllGather, "TP all-gather", n, {fi, fo},
                [comm, fi, fo, n](void* ns) {
                  return comm->all_gather_on(ns, fi.data<float>(), fo.data<float>(), n);
                });
    widened->out(s, out, fo);
  };
  tp.reduce_scatter = [comm, keep, count, widened, runner = options.runner](
                          gpu::Stream& s, const gpu::Tensor& in, const gpu::Tensor& out) {
    count(in.numel());
    const auto n = static_cast<std::size_t>(in.numel());
    const gpu::Tensor fi = widened->in(s, in, 0), fo = widened->scratch(s, out, 1);
    device_call(s, runner, What::kReduceScatter, "TP reduce-scatter", n, {fi, fo},
                [comm, fi, fo, n](void* ns) {
                  return comm->reduce_scatter_on(ns, fi.data<float>(), fo.data<float>(), n);
                });
    widened->out(s, out, fo);
  };
  return tp;
}

}  // namespace

std::unique_ptr<comm::StreamCollectives> in_stream_collectives(comm::Communicator* comm) {
  return std::make_unique<InStream>(comm);
}

model::TensorParallel tensor_link(comm::Communicator* comm, model::TpSlice slice,
                                  TensorLinkOptions options) {
  std::shared_ptr<comm::StreamCollectives> in_stream = in_stream_collectives(comm);
  comm::StreamCollectives* raw = in_stream.get();
  return link(raw, std::move(in_stream), slice, options);
}

model::TensorParallel device_tensor_link(comm::StreamCollectives* comm, model::TpSlice slice,
                                         TensorLinkOptions options) {
  return link(comm, nullptr, slice, options);
}

}  // namespace troupe::actors
