// An all-reduce among processes of one host through one POSIX shared memory
// segment (as DeepSpeed's and oneCCL's CPU all-reduce within a node), which
// the Communicator takes for two or more members that all share this host's
// memory (CommunicatorOptions::shared_memory).
//
// The buffer goes piece by piece, a slot's worth at a time (256 KiB):
//   step 0: every member copies its piece into its own slot;
//   barrier: every slot is written;
//   step 1: member i sums its share of the piece (chunk_range over the
//           piece) from every slot into the result;
//   barrier: the whole result is written;
//   step 2: every member copies the result out.
// A member writes its slot again only past the second barrier (every sum is
// done), and the result only past the next piece's first (every copy out is
// done). Two members go the same way with one pass less: each sums half of
// the piece (member m chunk_range(piece, 2, m)), so
//   step 0: each copies the half the other sums into its own slot;
//   barrier;
//   step 1: each adds the other's copy of its half into its buffer, writing
//           the sums into its own slot as well (one pass);
//   barrier;
//   step 2: each copies the other's half's sums out of the other's slot.
// Their slots are 8 pieces long (a segment of 4 MiB), and the pieces take
// the places in turn: a place is written again 8 pieces later, by when the
// other core no longer holds its lines (rewritten at every piece, as three
// or more members do, two members moved a quarter as much).
// Each member's arrivals are a counter in the segment; a member waits
// by yielding for 50 us, then asleep on a futex in the segment (woken by
// every arrival while anyone sleeps; 1 ms at most, so a failure the caller's
// `check` reports is seen within it). The caller's thread makes no transport
// progress meanwhile: the Communicator leaves that to the transport's own.
//
// Against the transport's messages (a descriptor, a read of the peer's
// memory and an acknowledgement each, log2 p or p-1 steps each way) a piece
// costs two copies and no system call but the waits' (`scripts/bench comm`:
// 4 processes on 2 cores, docs/ARCHITECTURE.md). Of two members, the
// messages' single copy (process_vm_readv) pins the peer's pages one by one
// in the kernel at every call, which cost as much as the copy itself.
//
// Each element is summed in the order the transport's algorithm for the same
// size and group would sum it (`SumOrder`), so the result is bit for bit the
// Communicator's either way, on every member (a NaN's payload aside: the
// two operands of an add may come the other way round; of two members every
// order is the same sum).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::comm {

enum class SumOrder {
  kMembers,  // ((x0 + x1) + x2) + ...: the direct exchange's
  kHalving,  // pairs at distance p/2, then p/4, ..., 1: recursive halving's (p a power of 2)
  kRing,     // element of chunk c (chunk_range over the whole buffer):
             // ((x[c+1] + x[c+2]) + ...) + x[c], members mod p: the ring's
};

class ShmAllReduce {
 public:
  static constexpr std::size_t kSlotFloats = std::size_t{64} << 10;  // 256 KiB a slot
  // Two members: each slot 8 pieces' places (2 MiB). At least 2: with one,
  // a short last piece's step 0 would write what the other may still copy
  // out of the piece before (its sums' range, there a longer one).
  static constexpr std::size_t kPairSlots = 8;
  static_assert(kPairSlots >= 2);

  // Member 0: a new segment for `members`, named uniquely (`name()`: this
  // process's id, a count and a random number, so no other segment, not even
  // one of another /dev/shm that a member might see instead, has it), its
  // memory allocated now (a full /dev/shm is an error here, not a SIGBUS
  // later). First removes the names of segments whose maker is gone (one
  // killed during its setup).
  static absl::StatusOr<std::unique_ptr<ShmAllReduce>> create(int members);
  // Member `me` of the others: the segment member 0 made and named.
  static absl::StatusOr<std::unique_ptr<ShmAllReduce>> open(const std::string& name, int members,
                                                            int me);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  const std::string& name() const { return name_; }
  // The /dev/shm a segment of `members` takes (tests: whether it fits).
  static std::size_t segment_bytes(int members);
  // Removes the name (member 0, once every member has the segment mapped):
  // the memory goes with the last mapping, whoever ends first.
  void unlink();

  // Called while waiting: not OK ends the wait (and the segment, fail_all)
  // with that status.
  using Check = std::function<absl::Status()>;
  // data[n] = sum over the members of their data[n], summed in `order`.
  // Every member calls it with the same n, order and `call` (the group's
  // collective it is, the Communicator's op: so a member that skipped one,
  // as an all-reduce of 0 floats, is caught too), else InvalidArgument on
  // every member.
  absl::Status all_reduce(float* data, std::size_t n, SumOrder order, std::uint32_t call,
                          const Check& check);
  // Ends every member's wait, now and later, with `why` (the first abort's,
  // of whichever member; thread-safe).
  void fail_all(const absl::Status& why);

 private:
  struct Header;
  struct Member;
  ShmAllReduce(std::string name, void* base, std::size_t bytes, int members, int me);
  static std::size_t header_bytes(int members);
  static std::size_t slot_floats(int members);
  static void remove_orphans();
  Member& member(int i) const;
  float* slot(int member) const;
  float* result() const;  // (three or more members: two have none)
  absl::Status arrive_and_wait(const Check& check);
  absl::Status same_call(std::size_t n);
  absl::Status pair_all_reduce(float* data, std::size_t n, const Check& check);
  absl::Status aborted_status() const;
  // result[b, e) of the piece at `offset` of an n-float buffer.
  void sum(std::size_t offset, std::size_t b, std::size_t e, std::size_t n, SumOrder order);

  std::string name_;
  void* base_;
  std::size_t bytes_;
  Header* header_;
  int members_, me_;
  std::uint32_t phase_ = 0;     // this member's arrivals so far
  std::uint64_t pieces_ = 0;    // two members: the pieces summed so far
  std::vector<float> scratch_;  // the halving's partial sums of one block
  std::mutex abort_mu_;         // this process's aborts write this member's reason one at a time
};

}  // namespace troupe::comm
