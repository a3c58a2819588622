// model::TensorParallel over a comm::Communicator: each collective is
// enqueued on the stream as a host callback and runs, in stream order, on
// the stream's thread, which waits while the peers take part. It works on
// host memory: on a device the host cannot read, the operands are copied to
// pinned host memory on the stream before it and the result back after it,
// so no device call runs inside the callback (CUDA forbids them there).
// NCCL on device buffers, issued when the op fires, is the fast path still
// to come (docs/CUDA.md). A failed collective fails the stream with
// Unavailable naming it.
//
//   model::TensorParallel tp = actors::tensor_link(comm.get(), {.tp = 2, .t = 1});
//   model::Gpt gpt(config, B, device, stage, 1, tp);
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/status.h"
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
};

// `comm` (the TP group, member t of slice.tp) must outlive the link.
model::TensorParallel tensor_link(comm::Communicator* comm, model::TpSlice slice,
                                  TensorLinkOptions options = {});

}  // namespace troupe::actors
