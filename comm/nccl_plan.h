// The NCCL calls that make one troupe collective, as plain data: CPU code,
// unit-tested without a GPU (tests/comm/nccl_plan_test.cc runs every plan
// through a model of NCCL's semantics for several members), and executed by
// comm/nccl_communicator.cc as one NCCL group.
//
// Sizes that divide among the members use NCCL's own collective; uneven
// ones (member i's part is chunk_range(n, p, i), as everywhere in comm/)
// one ncclReduce (reduce-scatter) or ncclBroadcast (all-gather) per member.
//
//   for (const NcclCall& c : plan_reduce_scatter(n, size, rank)) issue(c);
#pragma once

#include <cstddef>
#include <vector>

namespace troupe::comm {

struct NcclCall {
  enum class Op { kAllReduce, kReduceScatter, kAllGather, kReduce, kBroadcast };
  enum class Buffer { kIn, kOut };  // the collective's input or output
  struct Ref {
    Buffer buffer;
    std::size_t offset;  // in elements
  };
  Op op;
  Ref send, recv;
  // Elements per call as NCCL counts them: recvcount (reduce-scatter),
  // sendcount (all-gather), count (the others).
  std::size_t count;
  int root = 0;  // reduce and broadcast
};

// out[chunk_range(n, size, rank)] = sum over members of in[that range];
// `in` has n elements, `out` the member's part.
std::vector<NcclCall> plan_reduce_scatter(std::size_t n, int size, int rank);
// out[n] = every member's `in` (its part) at its range.
std::vector<NcclCall> plan_all_gather(std::size_t n, int size, int rank);

}  // namespace troupe::comm
