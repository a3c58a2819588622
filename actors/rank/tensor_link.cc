// The TP collectives as device calls on the stream (actors/rank/tensor_link.h).
#include "actors/rank/tensor_link.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

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
  absl::Status broadcast_on(void* stream, const float* in, float* out, std::size_t n,
                            int root) override {
    if (stream != nullptr) return not_cpu();
    if (comm_->rank() == root && in != out && n > 0) std::memcpy(out, in, n * sizeof(float));
    return unavailable(comm_->broadcast_sync(out, n, root));
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

// The link over `comm`; `keep` (may be null) lives as long as the link.
model::TensorParallel link(comm::StreamCollectives* comm, std::shared_ptr<void> keep,
                           model::TpSlice slice, const TensorLinkOptions& options) {
  model::TensorParallel tp;
  tp.slice = slice;
  auto count = [counter = options.reduced_floats](std::int64_t n) {
    if (counter) *counter += n;
  };
  tp.all_reduce = [comm, keep, count, runner = options.runner](gpu::Stream& s,
                                                               const gpu::Tensor& x) {
    count(x.numel());
    const auto n = static_cast<std::size_t>(x.numel());
    device_call(s, runner, What::kAllReduce, "TP all-reduce", n, {x},
                [comm, x, n](void* ns) { return comm->all_reduce_on(ns, x.data<float>(), n); });
  };
  tp.all_gather = [comm, keep, runner = options.runner](gpu::Stream& s, const gpu::Tensor& in,
                                                        const gpu::Tensor& out) {
    const auto n = static_cast<std::size_t>(out.numel());
    device_call(s, runner, What::kAllGather, "TP all-gather", n, {in, out},
                [comm, in, out, n](void* ns) {
                  return comm->all_gather_on(ns, in.data<float>(), out.data<float>(), n);
                });
  };
  tp.reduce_scatter = [comm, keep, count, runner = options.runner](
                          gpu::Stream& s, const gpu::Tensor& in, const gpu::Tensor& out) {
    count(in.numel());
    const auto n = static_cast<std::size_t>(in.numel());
    device_call(s, runner, What::kReduceScatter, "TP reduce-scatter", n, {in, out},
                [comm, in, out, n](void* ns) {
                  return comm->reduce_scatter_on(ns, in.data<float>(), out.data<float>(), n);
                });
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
