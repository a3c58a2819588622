// The TP collectives as stream host callbacks or device calls (actors/tensor_link.h).
#include "actors/tensor_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu/host_mirror.h"

namespace troupe::actors {
namespace {

using comm::trace::What;

// Enqueues `run` on the stream; a failure fails the stream, naming `what`.
void in_stream_order(gpu::Stream& s, const CollectiveRunner& runner, What op, const char* what,
                     std::size_t floats, std::function<absl::Status()> run) {
  s.host_callback([&s, runner, op, what, floats, run = std::move(run)] {
    absl::Status st = runner ? runner(op, floats, run) : run();
    if (!st.ok()) s.fail(absl::UnavailableError(absl::StrCat("TP ", what, ": ", st.message())));
  });
}

// A collective from `in` into `out` (all-gather, reduce-scatter) on host
// copies: `in` to the host behind the ops before it, `out` back in front of
// the ops after it.
void in_to_out(gpu::Stream& s, const CollectiveRunner& runner, What op, const char* what,
               std::size_t floats, const gpu::Tensor& in, const gpu::Tensor& out,
               std::function<absl::Status(const float*, float*)> run) {
  const gpu::HostMirror a(in), b(out);
  a.to_host(s);
  in_stream_order(s, runner, op, what, floats,
                  [hin = a.host(), hout = b.host(), run = std::move(run)] {
                    return run(hin.host<float>(), hout.host<float>());
                  });
  b.to_device(s);
}

// A device call of a collective (`run`, given the native stream), holding
// `held`; a failure fails the stream, naming `what`.
void device_call(gpu::Stream& s, const CollectiveRunner& runner, What op, const char* what,
                 std::size_t floats, std::vector<gpu::Tensor> held,
                 std::function<absl::Status(void*)> run) {
  s.device_call(what, std::move(held),
                [runner, op, floats, run = std::move(run)](void* native) -> absl::Status {
                  auto call = [&] { return run(native); };
                  absl::Status st = runner ? runner(op, floats, call) : call();
                  return st;
                });
}

class InStream final : public comm::StreamCollectives {
 public:
  explicit InStream(comm::Communicator* comm) : comm_(comm) {}
  absl::Status all_reduce_on(void* stream, float* data, std::size_t n) override {
    if (stream != nullptr) return not_cpu();
    return comm_->all_reduce_sync(data, n);
  }
  absl::Status reduce_scatter_on(void* stream, const float* in, float* out,
                                 std::size_t n) override {
    if (stream != nullptr) return not_cpu();
    return comm_->reduce_scatter_sync(in, out, n);
  }
  absl::Status all_gather_on(void* stream, const float* in, float* out, std::size_t n) override {
    if (stream != nullptr) return not_cpu();
    return comm_->all_gather_sync(in, out, n);
  }

 private:
  static absl::Status not_cpu() {
    return absl::InternalError("in_stream_collectives on a stream that is not the CPU's");
  }
  comm::Communicator* comm_;
};

}  // namespace

std::unique_ptr<comm::StreamCollectives> in_stream_collectives(comm::Communicator* comm) {
  return std::make_unique<InStream>(comm);
}

model::TensorParallel device_tensor_link(comm::StreamCollectives* comm, model::TpSlice slice,
                                         TensorLinkOptions options) {
  model::TensorParallel tp;
  tp.slice = slice;
  auto count = [counter = options.reduced_floats](std::int64_t n) {
    if (counter) *counter += n;
  };
  tp.all_reduce = [comm, count, runner = options.runner](gpu::Stream& s, const gpu::Tensor& x) {
    count(x.numel());
    const auto n = static_cast<std::size_t>(x.numel());
    device_call(s, runner, What::kAllReduce, "TP all-reduce", n, {x},
                [comm, x, n](void* ns) { return comm->all_reduce_on(ns, x.data<float>(), n); });
  };
  tp.all_gather = [comm, runner = options.runner](gpu::Stream& s, const gpu::Tensor& in,
                                                  const gpu::Tensor& out) {
    const auto n = static_cast<std::size_t>(out.numel());
    device_call(s, runner, What::kAllGather, "TP all-gather", n, {in, out},
                [comm, in, out, n](void* ns) {
                  return comm->all_gather_on(ns, in.data<float>(), out.data<float>(), n);
                });
  };
  tp.reduce_scatter = [comm, count, runner = options.runner](gpu::Stream& s, const gpu::Tensor& in,
                                                             const gpu::Tensor& out) {
    count(in.numel());
    const auto n = static_cast<std::size_t>(in.numel());
    device_call(s, runner, What::kReduceScatter, "TP reduce-scatter", n, {in, out},
                [comm, in, out, n](void* ns) {
                  return comm->reduce_scatter_on(ns, in.data<float>(), out.data<float>(), n);
                });
  };
  return tp;
}

model::TensorParallel tensor_link(comm::Communicator* comm, model::TpSlice slice,
                                  TensorLinkOptions options) {
  model::TensorParallel tp;
  tp.slice = slice;
  auto count = [counter = options.reduced_floats](std::int64_t n) {
    if (counter) *counter += n;
  };
  // Each collective reads and writes host memory (gpu/host_mirror.h): the
  // tensors themselves on the CPU; on a device, host copies made on the
  // stream behind the ops before it, and copied back in front of the ops
  // after it, so that the callback makes no device call.
  tp.all_reduce = [comm, count, runner = options.runner](gpu::Stream& s, const gpu::Tensor& x) {
    count(x.numel());
    const auto n = static_cast<std::size_t>(x.numel());
    const gpu::HostMirror m(x);
    m.to_host(s);
    in_stream_order(s, runner, What::kAllReduce, "all-reduce", n,
                    [comm, h = m.host(), n] { return comm->all_reduce_sync(h.host<float>(), n); });
    m.to_device(s);
  };
  tp.all_gather = [comm, runner = options.runner](gpu::Stream& s, const gpu::Tensor& in,
                                                  const gpu::Tensor& out) {
    const auto n = static_cast<std::size_t>(out.numel());
    in_to_out(s, runner, What::kAllGather, "all-gather", n, in, out,
              [comm, n](const float* a, float* b) { return comm->all_gather_sync(a, b, n); });
  };
  tp.reduce_scatter = [comm, count, runner = options.runner](gpu::Stream& s, const gpu::Tensor& in,
                                                             const gpu::Tensor& out) {
    count(in.numel());
    const auto n = static_cast<std::size_t>(in.numel());
    in_to_out(s, runner, What::kReduceScatter, "reduce-scatter", n, in, out,
              [comm, n](const float* a, float* b) { return comm->reduce_scatter_sync(a, b, n); });
  };
  return tp;
}

}  // namespace troupe::actors
