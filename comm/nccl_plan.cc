// NCCL call plans for reduce-scatter and all-gather; see comm/nccl_plan.h.
#include "comm/nccl_plan.h"

#include "comm/communicator.h"

namespace troupe::comm {

using Op = NcclCall::Op;
using Buffer = NcclCall::Buffer;

std::vector<NcclCall> plan_reduce_scatter(std::size_t n, int size, int /*rank*/) {
  const auto p = static_cast<std::size_t>(size);
  if (n % p == 0) return {{Op::kReduceScatter, {Buffer::kIn, 0}, {Buffer::kOut, 0}, n / p}};
  // Member i roots the reduce of its own range; its output is its whole `out`.
  std::vector<NcclCall> calls;
  for (int i = 0; i < size; i++) {
    auto [b, e] = chunk_range(n, size, i);
    calls.push_back({Op::kReduce, {Buffer::kIn, b}, {Buffer::kOut, 0}, e - b, i});
  }
  return calls;
}

std::vector<NcclCall> plan_all_gather(std::size_t n, int size, int rank) {
  const auto p = static_cast<std::size_t>(size);
  if (n % p == 0) return {{Op::kAllGather, {Buffer::kIn, 0}, {Buffer::kOut, 0}, n / p}};
  // Member i broadcasts its part into everyone's `out` at its range (the
  // root sends from its `in`; the others' send buffer is not read).
  std::vector<NcclCall> calls;
  for (int i = 0; i < size; i++) {
    auto [b, e] = chunk_range(n, size, i);
    const NcclCall::Ref send =
        i == rank ? NcclCall::Ref{Buffer::kIn, 0} : NcclCall::Ref{Buffer::kOut, b};
    calls.push_back({Op::kBroadcast, send, {Buffer::kOut, b}, e - b, i});
  }
  return calls;
}

}  // namespace troupe::comm
