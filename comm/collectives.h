// The interface every collective backend offers: the Communicator built
// from transport messages (CPU buffers) and the NCCL one (device buffers).
// Calls are asynchronous and complete through a callback; every member of a
// group issues the same calls in the same order.
#pragma once

#include <cstddef>

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

}  // namespace troupe::comm
