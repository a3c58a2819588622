// The TP collectives as stream host callbacks (actors/tensor_link.h).
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

}  // namespace

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
