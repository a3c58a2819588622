// The interfaces collective backends offer. Collectives: the Communicator
// built from transport messages (CPU buffers) and the NCCL one (device
// buffers); calls are asynchronous and complete through a callback.
// StreamCollectives: the NCCL one's calls into a CUDA stream's order. Every
// member of a group issues the same calls in the same order.
// StreamPointToPoint: in-order channels between two members, in a stream's
// order (NCCL's; comm/stream_channel.h's over a transport for the CPU).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "comm/transport.h"

namespace troupe::comm {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;  // index in the group
  virtual int size() const = 0;
  // fp32 sums. Member i's part of n elements is chunk_range(n, size, i).
  virtual void all_reduce(float* data, std::size_t n, Callback done) = 0;
  virtual void reduce_scatter(const float* in, float* out, std::size_t n, Callback done) = 0;
  virtual void all_gather(const float* in, float* out, std::size_t n, Callback done) = 0;
  virtual void broadcast(float* data, std::size_t n, int root, Callback done) = 0;
  // Fails the pending and later calls with `why` (a member died).
  virtual void fail(absl::Status why) = 0;
};

// Collectives put into a device stream's own order, as NCCL's are: each call
// enqueues the collective behind the work already on `stream` (the handle
// gpu::Stream::device_call passes: a cudaStream_t) and returns once it is
// enqueued, with the error of the enqueue; the collective then runs in the
// stream's order, before the work enqueued after it. Every member makes the
// same calls in the same order, one at a time. Sizes and parts as in
// Collectives.
class StreamCollectives {
 public:
  virtual ~StreamCollectives() = default;
  virtual absl::Status all_reduce_on(void* stream, float* data, std::size_t n) = 0;
  virtual absl::Status reduce_scatter_on(void* stream, const float* in, float* out,
                                         std::size_t n) = 0;
  virtual absl::Status all_gather_on(void* stream, const float* in, float* out, std::size_t n) = 0;
  // out[n] of member `root` = the members' `in` summed (NCCL's order on
  // GPUs; member order, from zeros, on the CPU); the others' `out` is not
  // used (may be null). The root's `in` may be its `out`.
  virtual absl::Status reduce_on(void* stream, const float* in, float* out, std::size_t n,
                                 int root) = 0;
  // out[bytes] of every member = member `root`'s `in` (the others' `in` is
  // not used; the root's may be its `out`). Bytes, not floats: a copy needs
  // no element type (ZeRO-1's bf16 parameter pieces travel so).
  virtual absl::Status broadcast_on(void* stream, const void* in, void* out, std::size_t bytes,
                                    int root) = 0;
};

// Point-to-point calls in a device stream's order, as NCCL's ncclSend and
// ncclRecv: each call enqueues its transfer behind the work on `stream` (as
// StreamCollectives' calls) and returns once it is enqueued. A channel is
// in order: the k-th send to a peer fills that peer's k-th receive from
// this member, whatever the sizes, so both sides make their calls in one
// agreed order; a call waits in the stream until its peer makes the match.
// `peer` is an index in the group; sizes are in bytes (a tensor of any dtype).
class StreamPointToPoint {
 public:
  virtual ~StreamPointToPoint() = default;
  virtual absl::Status send_on(void* stream, const void* data, std::size_t bytes, int peer) = 0;
  virtual absl::Status recv_on(void* stream, void* data, std::size_t bytes, int peer) = 0;
};

}  // namespace troupe::comm
