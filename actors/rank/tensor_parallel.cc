// A rank's TP group: its link's collectives (actors/rank/tensor_link.h) and, on
// CUDA, the NCCL communicator they go through.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actors/rank/connected_collectives.h"
#include "actors/rank/rank.h"
#include "actors/rank/tensor_link.h"
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
  // bf16/fp16: the collectives' fp32 buffers, made now (memory_plan.cc
  // counts them): a (B, T, C) sum, and with sequence parallelism the
  // gathered side.
  const model::TrainOptions& o = spec_.options;
  if (o.activations.precision != gpu::Precision::kFp32) {
    const std::int64_t btc = std::int64_t{o.micro_batch} * o.model.T * o.model.C;
    link.stream = stream_.get();
    link.reserve_floats = {btc, o.activations.sequence_parallel ? btc : 0};
  }
  link.runner = [comm = tensor_.get(), rt = trace_.get()](
                    comm::trace::What op, std::size_t floats,
                    const std::function<absl::Status()>& run) {
    return traced_collective(rt, comm, op, floats, run);
  };
  if (dev.host_visible()) {
    *tensor = tensor_link(tensor_.get(), tensor->slice, std::move(link));
    return absl::OkStatus();
  }
  // The device's own buffers, each collective a device call, through what
  // connect() makes: NCCL's communicator on CUDA, the Communicator's
  // collectives on the opaque CPU device (so that its tests run connect()).
  if (dev.kind() == gpu::DeviceKind::kCuda) {
    // Not traced: the call is made on the actor's thread when the op is
    // enqueued, not where the stream's marks set RankTrace::current (its
    // host functions), and NCCL's kernels would need an event pair to time.
    link.runner = nullptr;
  }
  tp_device_ = std::make_unique<ConnectedCollectives>("the TP group");
  *tensor = device_tensor_link(tp_device_.get(), tensor->slice, std::move(link));
  return absl::OkStatus();
}

namespace {

// NCCL's id, and its size where NCCL is not built (the opaque device's
// connect() sends one of the same size).
constexpr std::size_t kIdBytes = kConnectIdBytes;

}  // namespace

absl::Status RankUnit::connect() {
  if (absl::Status st = connect_tensor_parallel(); !st.ok()) return st;
  if (absl::Status st =
          connect_group(data_group_.get(), dynamic_cast<ConnectedCollectives*>(dp_device_.get()),
                        "data-parallel group", &dp_nccl_);
      !st.ok()) {
    return st;
  }
  return connect_links();
}

absl::Status RankUnit::connect_tensor_parallel() {
  return connect_group(tensor_.get(), dynamic_cast<ConnectedCollectives*>(tp_device_.get()),
                       "TP group", &nccl_);
}

absl::Status RankUnit::connect_group(comm::Communicator* group, ConnectedCollectives* pending,
                                     const char* name, std::atomic<comm::Collectives*>* made) {
  if (pending == nullptr || pending->connected()) return absl::OkStatus();
  const bool cuda = stream_->device().kind() == gpu::DeviceKind::kCuda;
  // Member 0's id, behind a byte that says whether it could make one: the
  // others learn of its failure instead of waiting for an id.
  std::string msg(1 + kIdBytes, '\0');
  absl::Status ok = absl::OkStatus();
  if (group->rank() == 0) {
#ifdef TROUPE_HAVE_NCCL
    if (cuda) {
      absl::StatusOr<std::string> id = comm::nccl_unique_id();
      if (id.ok()) {
        msg.replace(1, kIdBytes, *id);
      } else {
        ok = id.status();
      }
    }
#endif
    msg[0] = ok.ok() ? 1 : 0;
  }
  if (absl::Status st = comm::broadcast_bytes(*group, &msg, /*root=*/0); !st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("sharing NCCL's id in the ", name, ": ", st.message()));
  }
  if (!ok.ok()) return ok;
  if (msg[0] != 1) {
    return absl::UnavailableError(absl::StrCat(
        "member 0 of the ", name, " could not make NCCL's id (its error is in its log)"));
  }
  if (!cuda) {
    pending->set(in_stream_collectives(group));
    return absl::OkStatus();
  }
#ifdef TROUPE_HAVE_NCCL
  absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl = comm::NcclCommunicator::create(
      msg.substr(1), group->rank(), group->size(), stream_->device().index(), &connect_cancelled_);
  if (!nccl.ok()) {
    return absl::Status(nccl.status().code(),
                        absl::StrCat("the ", name, "'s NCCL communicator (rank ", spec_.rank,
                                     ", member ", group->rank(), " of ", group->size(), ", ",
                                     stream_->device().name(), "): ", nccl.status().message(),
                                     absl::StrContains(nccl.status().message(), "invalid usage")
                                         ? " (NCCL takes a GPU per member: do two share one?)"
                                         : ""));
  }
  // A member that dies with a collective in flight, where NCCL notices
  // (over the network; on NVLink and shared memory its kernels wait until
  // the runtime's failure path aborts it): the streams that issue its
  // calls fail, naming it.
  std::vector<gpu::Stream*> issuers{stream_.get()};
  if (optimizer_stream_ != stream_.get()) issuers.push_back(optimizer_stream_);  // (dp 1: one)
  (*nccl)->on_failure([streams = std::move(issuers), rank = spec_.rank, name](absl::Status why) {
    for (gpu::Stream* s : streams) {
      s->fail(absl::UnavailableError(
          absl::StrCat("collective of the ", name, " (NCCL) on rank ", rank, ": ", why.message())));
    }
  });
  comm::NcclCommunicator* made_nccl = nccl->get();
  pending->set(*std::move(nccl));  // (owned for the unit's life from here)
  *made = made_nccl;
  // A cancel after create()'s last look, before fail_pending could see it.
  if (connect_cancelled_) {
    const absl::Status why = absl::CancelledError("the job stopped while the ranks connected");
    made_nccl->fail(why);
    return why;
  }
  return absl::OkStatus();
#else
  (void)made;
  return absl::InternalError(absl::StrCat("RankUnit::connect: the ", name,
                                          "'s collectives on CUDA in a build without NCCL"));
#endif
}

}  // namespace troupe::actors
