// Collectives on device buffers through NCCL (built when CUDA is present).
//
// One issuing thread per communicator puts the NCCL calls on its CUDA
// stream in the order they were requested (every member requests the same
// calls in the same order); each call's callback runs when the stream has
// finished it (cudaStreamAddCallback). The *_on calls (StreamCollectives) are
// issued at once on the caller's thread into the caller's stream; the
// issuing thread then watches for NCCL's asynchronous errors. Both kinds
// take one lock around their NCCL calls, and the abort and the error polls
// take it too (a poll may complete a pending call's launch). Uneven splits use grouped
// ncclReduce/ncclBroadcast per member; even ones ncclReduceScatter/AllGather.
//
//   std::string id = *comm::nccl_unique_id();           // on member 0, shared by bootstrap
//   auto c = comm::NcclCommunicator::create(id, rank, size, /*device=*/local_rank);
//   (*c)->all_reduce(device_ptr, n, [](absl::Status st) { ... });
//   absl::Status st = (*c)->all_reduce_on(cuda_stream, device_ptr, n);  // in its order
//   st = (*c)->send_on(cuda_stream, device_ptr, bytes, /*peer=*/1);     // ncclSend, in order
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/collectives.h"

namespace troupe::comm {

// The size of NCCL's unique id (NCCL_UNIQUE_ID_BYTES), which
// nccl_unique_id() returns and create() takes.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;
absl::StatusOr<std::string> nccl_unique_id();
// The UUID of CUDA device `device` (16 bytes): two processes on one GPU
// (which NCCL refuses as members of one communicator) see the same.
inline constexpr std::size_t kCudaUuidBytes = 16;
absl::StatusOr<std::string> cuda_device_uuid(int device);

class NcclCommunicator : public Collectives, public StreamCollectives, public StreamPointToPoint {
 public:
  // Waits until every member has joined (NCCL's init), for at most 5
  // minutes, or until `*cancelled` (if given) turns true.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> create(
      const std::string& unique_id, int rank, int size, int device,
      const std::atomic<bool>* cancelled = nullptr);
  // Called once, on the issuing thread, when NCCL reports an asynchronous
  // error (a member died) after a stream-ordered call: the communicator is
  // aborted (its kernels end, the stream goes on) and `failed` tells the
  // owner of that stream, which fails it. Set before the first such call.
  virtual void on_failure(std::function<void(absl::Status)> failed) = 0;
};

}  // namespace troupe::comm
