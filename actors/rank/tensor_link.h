// model::TensorParallel: the TP collectives of the model's ops, each a
// device call (gpu::Stream::device_call) in the stream's order, made when
// the op that needs it is enqueued, on the tensors' own memory.
// - tensor_link, over a comm::Communicator, for the CPU backend (opaque
//   too): the call runs on the stream's thread, which waits there while the
//   peers take part.
// - device_tensor_link, over any comm::StreamCollectives: on CUDA NCCL's,
//   made at once on the actor's thread into the compute stream (never
//   inside a host callback, where CUDA forbids it).
// Every member enqueues the same collectives in the same order: the rank's
// one compute stream runs its ops in the schedule's order, which every
// member of a TP group shares. A failed collective fails the stream,
// naming it (Unavailable when a member is gone).
//
//   model::TensorParallel tp = actors::tensor_link(comm.get(), {.tp = 2, .t = 1});
//   model::Gpt gpt(config, B, device, stage, 1, tp);
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/trace.h"
#include "model/gpt.h"

namespace troupe::actors {

// Runs one collective (`run`) of `floats` floats; a tracing rank wraps it
// in an event, the default runs it.
using CollectiveRunner = std::function<absl::Status(comm::trace::What op, std::size_t floats,
                                                    const std::function<absl::Status()>& run)>;

struct TensorLinkOptions {
  CollectiveRunner runner;  // default: run the collective as it is
  // Counts the floats all-reduced and reduce-scattered (tests); may be null.
  std::shared_ptr<std::atomic<std::int64_t>> reduced_floats;
  // bf16/fp16 tensors are summed in two fp32 buffers of the stream they
  // are enqueued on; these sizes (floats) are allocated on `stream` when
  // the link is made, so that they count with the rank's memory (0: on
  // first use).
  gpu::Stream* stream = nullptr;
  std::array<std::int64_t, 2> reserve_floats{0, 0};
};

// `comm` (the TP group, member t of slice.tp) must outlive the link.
// `runner` wraps each device call: on a CPU stream, where it runs, the whole
// collective.
model::TensorParallel tensor_link(comm::Communicator* comm, model::TpSlice slice,
                                  TensorLinkOptions options = {});
model::TensorParallel device_tensor_link(comm::StreamCollectives* comm, model::TpSlice slice,
                                         TensorLinkOptions options = {});
// tensor_link's collectives, for a device whose device calls run on the
// stream's thread (the CPU backend's, opaque or not): each call runs the
// collective, waiting for the peers, and returns when it is done.
std::unique_ptr<comm::StreamCollectives> in_stream_collectives(comm::Communicator* comm);

}  // namespace troupe::actors
