// Collectives on device buffers through NCCL (built when CUDA is present).
//
// One issuing thread per communicator puts the NCCL calls on its CUDA
// stream in the order they were requested (every member requests the same
// calls in the same order); each call's callback runs when the stream has
// finished it (cudaLaunchHostFunc). Uneven splits use grouped
// ncclReduce/ncclBroadcast per member; even ones ncclReduceScatter/AllGather.
//
//   std::string id = *comm::nccl_unique_id();           // on member 0, shared by bootstrap
//   auto c = comm::NcclCommunicator::create(id, rank, size, /*device=*/local_rank);
//   (*c)->all_reduce(device_ptr, n, [](absl::Status st) { ... });
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/collectives.h"

namespace troupe::comm {

absl::StatusOr<std::string> nccl_unique_id();

class NcclCommunicator : public Collectives {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> create(const std::string& unique_id,
                                                                  int rank, int size, int device);
};

}  // namespace troupe::comm
