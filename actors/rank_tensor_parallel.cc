// A rank's TP group: its link's collectives (actors/tensor_link.h) and, on
// CUDA, the NCCL communicator they go through.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "actors/rank.h"
#include "actors/tensor_link.h"
#ifdef TROUPE_HAVE_NCCL
#include "comm/nccl_communicator.h"
#endif

namespace troupe::actors {
namespace {

// Runs one TP collective on the stream's thread, as an open collective
// event of the op the stream is in (RankTrace::current) until it returns:
// a rank hung inside collective #N shows it open, a peer that never
// entered it does not.
absl::Status traced_collective(RankTrace* rt, comm::Communicator* comm, comm::trace::What op,
                               std::size_t floats, const std::function<absl::Status()>& run) {
  if (rt->recorder == nullptr) return run();
  comm::trace::Event e = rt->current;
  e.kind = comm::trace::Kind::kCollective;
  e.what = op;
  e.bytes = static_cast<std::int64_t>(floats * sizeof(float));
  e.seq = rt->collective_seq++;
  e.begin_ns = 0;
  comm->set_trace_step(e.step);
  const comm::trace::Recorder::Handle h = rt->recorder->open(e);
  absl::Status st = run();
  rt->recorder->close(h, !st.ok());
  return st;
}

// The TP link's collectives before connect() has made NCCL's communicator
// (which needs the peers, reachable only once the transport is connected):
// a call before then fails, naming the missing step.
class Connected final : public comm::StreamCollectives {
 public:
  void set(std::unique_ptr<comm::StreamCollectives> to) { to_ = std::move(to); }
  bool connected() const { return to_ != nullptr; }
  absl::Status all_reduce_on(void* stream, float* data, std::size_t n) override {
    if (!to_) return not_yet();
    return to_->all_reduce_on(stream, data, n);
  }
  absl::Status reduce_scatter_on(void* stream, const float* in, float* out,
                                 std::size_t n) override {
    if (!to_) return not_yet();
    return to_->reduce_scatter_on(stream, in, out, n);
  }
  absl::Status all_gather_on(void* stream, const float* in, float* out, std::size_t n) override {
    if (!to_) return not_yet();
    return to_->all_gather_on(stream, in, out, n);
  }

 private:
  static absl::Status not_yet() {
    return absl::FailedPreconditionError(
        "a TP collective before RankUnit::connect() made the NCCL communicator");
  }
  std::unique_ptr<comm::StreamCollectives> to_;
};

}  // namespace

absl::Status RankUnit::make_tensor_parallel(gpu::Device& dev, model::TensorParallel* tensor) {
  const ParallelOptions& par = spec_.parallel;
#ifndef TROUPE_HAVE_NCCL
  if (dev.kind() == gpu::DeviceKind::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", par.tp, " on ", dev.name(),
        ": tensor parallelism on GPUs needs NCCL, and this troupe was built without it"));
  }
#endif
  tensor_ = std::make_unique<comm::Communicator>(*transport_, par.layout().tensor_group(spec_.rank),
                                                 comm::GroupKind::kTensor);
  tensor_->set_recorder(trace_->recorder);
  TensorLinkOptions link;
  link.reduced_floats = tp_floats_;
  link.runner = [comm = tensor_.get(), rt = trace_.get()](
                    comm::trace::What op, std::size_t floats,
                    const std::function<absl::Status()>& run) {
    return traced_collective(rt, comm, op, floats, run);
  };
  if (dev.host_visible()) {
    *tensor = tensor_link(tensor_.get(), tensor->slice, std::move(link));
    return absl::OkStatus();
  }
  // The device's own buffers, each collective a device call.
  if (dev.kind() == gpu::DeviceKind::kCuda) {
    tp_device_ = std::make_unique<Connected>();
    // Not traced: the call is made on the actor's thread when the op is
    // enqueued, not where the stream's marks set RankTrace::current (its
    // host functions), and NCCL's kernels would need an event pair to time.
    link.runner = nullptr;
  } else {
    tp_device_ = in_stream_collectives(tensor_.get());
  }
  *tensor = device_tensor_link(tp_device_.get(), tensor->slice, std::move(link));
  return absl::OkStatus();
}

absl::Status RankUnit::connect() {
  auto* pending = dynamic_cast<Connected*>(tp_device_.get());
  if (pending == nullptr || pending->connected()) return absl::OkStatus();
#ifdef TROUPE_HAVE_NCCL
  const ParallelOptions& par = spec_.parallel;
  // Member 0 makes the id; the group's Communicator carries it as it is.
  std::string id(comm::kNcclUniqueIdBytes, '\0');
  if (tensor_->rank() == 0) {
    absl::StatusOr<std::string> made = comm::nccl_unique_id();
    if (!made.ok()) return made.status();
    id = *std::move(made);
  }
  if (absl::Status st = comm::broadcast_bytes(*tensor_, &id, /*root=*/0); !st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("sharing NCCL's id in the TP group: ", st.message()));
  }
  absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl =
      comm::NcclCommunicator::create(id, tensor_->rank(), par.tp, stream_->device().index());
  if (!nccl.ok()) {
    return absl::Status(
        nccl.status().code(),
        absl::StrCat("the TP group's NCCL communicator (rank ", spec_.rank, ", member ",
                     tensor_->rank(), " of ", par.tp, "): ", nccl.status().message()));
  }
  // A member that dies with a collective in flight: NCCL says so
  // asynchronously; the stream waiting for it fails, naming it.
  (*nccl)->on_failure([stream = stream_.get()](absl::Status why) {
    stream->fail(absl::UnavailableError(absl::StrCat("TP collective (NCCL): ", why.message())));
  });
  nccl_ = nccl->get();
  pending->set(*std::move(nccl));
  return absl::OkStatus();
#else
  return absl::InternalError("RankUnit::connect: a CUDA TP link in a build without NCCL");
#endif
}

}  // namespace troupe::actors
