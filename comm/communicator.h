// Collectives over a group of ranks, built from transport messages.
//
// A Communicator runs its collectives one at a time, in the order they were
// issued, on a thread of its own, and reports each through a callback, so a
// caller (an actor) never blocks. A synchronous call (*_sync) with nothing
// queued ahead of it runs on the caller's thread instead. Every member must issue the same
// collectives in the same order (TP peers walk the same schedule).
//
// Algorithms (fp32 sum): rings for large buffers (reduce-scatter then
// all-gather, each chunk sliced so that sends, receives and adds overlap),
// direct exchange for small ones (every rank sums all contributions in rank
// order), a sliced chain for broadcast, a gather for reduce. The order of every sum is fixed, and
// each element's sum is computed once and copied to the others, so results
// are bitwise identical on every rank and on every run. An all-reduce of
// processes of one host goes through one shared memory segment instead of
// messages (comm/shm_all_reduce.h), summing each element in the order its
// algorithm would: the same bits.
//
// Uneven sizes: element range of member i is chunk_range(n, p, i) (the first
// n % p members get one more). An aborted communicator (a member died)
// completes its pending and later collectives with the abort's error.
//
//   comm::Communicator tp(transport, tp_ranks, comm::GroupKind::kTensor);
//   tp.all_reduce(x, n, [self](absl::Status st) { ... });
//   absl::Status st = tp.all_reduce_sync(x, n);   // tests and simple callers
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/callback_queue.h"
#include "comm/collectives.h"
#include "comm/shm_all_reduce.h"
#include "comm/trace.h"
#include "comm/transport.h"

namespace troupe::comm {

// [begin, end) of member i's part of n elements split over p members.
std::pair<std::size_t, std::size_t> chunk_range(std::size_t n, int p, int i);

struct CommunicatorOptions {
  std::size_t slice_bytes = 512 << 10;       // pipelining granularity of rings and chains
  std::size_t direct_max_bytes = 32 << 10;   // all-reduce by direct exchange up to this size
  std::size_t read_piece_bytes = 512 << 10;  // a received slice is read and added in these
  // All-reduce by recursive halving and doubling (log2 p steps each way, p a
  // power of two) up to this size, by ring above it.
  std::size_t halving_max_bytes = std::size_t{1} << 40;
  // An all-reduce of two members and at most this many bytes moves its
  // messages by copies through shared memory (Route::kCopies), not by the
  // single-copy protocol: its buffers stay in cache, where a copy costs
  // less than the protocol's round trip (docs/ARCHITECTURE.md has the
  // measurements; of four members on 2 cores, where copies cost cores the
  // ranks share, neither route was ahead). 1 MiB on every CPU: on a 2-core
  // Intel Xeon and a 2-core AMD EPYC (Zen 4) alike, copies led up to 1 MiB
  // and the single copy from 1.5 MiB. The members on one host must give the
  // same (the route matters only there, and there only without the shared
  // memory segment below: `shared_memory` false, or a segment not made).
  std::size_t copies_max_bytes = std::size_t{1} << 20;
  // An all-reduce of two or more members, every one a process of this host
  // (Transport::shares_memory_with), goes through one shared memory segment
  // (comm/shm_all_reduce.h), set up at the first: the same sums, bit for
  // bit, with no transport message but the setup's. Like the sizes above,
  // the same on every member (one without would never join the setup the
  // others wait in). Every all-reduce of such a group takes it, whatever
  // its size, so members that call with different sizes meet in the
  // segment and fail there (InvalidArgument on all), as messages of
  // different sizes do. Two members' segment against their messages on the
  // 2-core AMD EPYC (bench/comm_bench, 2 processes bound to a core each,
  // two alternating sweeps of 1 to 16 KiB, 2,000 all-reduces a size): 4 KiB
  // 1.8-2.2 against 2.5-2.9 us, 16 KiB 3.7-5.0 against 6.2-6.4; 1 KiB, a
  // sweep's first size (a process's first ~100 ms ran slow whichever the
  // way), 31.8-44.8 against 40.7-45.3 (docs/RUNTIME_COST.md has the rest).
  bool shared_memory = true;
};

class Communicator final : public Collectives {
 public:
  // `ranks`: the group's global ranks in member order; must contain
  // transport.rank().
  Communicator(Transport& transport, std::vector<int> ranks, GroupKind kind,
               CommunicatorOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const override { return me_; }  // index in the group
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }

  // data[n] = sum over members of their data[n].
  void all_reduce(float* data, std::size_t n, Callback done) override;
  // out[chunk_range(n, p, me)] = sum over members of in[that range].
  void reduce_scatter(const float* in, float* out, std::size_t n, Callback done) override;
  // out[n]: member i's in (of chunk_range(n, p, i) size) at its range.
  void all_gather(const float* in, float* out, std::size_t n, Callback done) override;
  // data[n] of member `root` to every member.
  void broadcast(float* data, std::size_t n, int root, Callback done) override;
  // out[n] of member `root` = ((0 + in_0) + in_1) + ... + in_{p-1}, the
  // members' `in` summed in member order (a ZeRO-1 partition's gradient:
  // the replicas' pieces in replica order). `out` is the root's only (the
  // others may pass null); the root's may be its `in`.
  void reduce(const float* in, float* out, std::size_t n, int root, Callback done);

  absl::Status all_reduce_sync(float* data, std::size_t n);
  absl::Status reduce_scatter_sync(const float* in, float* out, std::size_t n);
  absl::Status all_gather_sync(const float* in, float* out, std::size_t n);
  absl::Status broadcast_sync(float* data, std::size_t n, int root);
  absl::Status reduce_sync(const float* in, float* out, std::size_t n, int root);

  // Fails the current and every later collective with `why` (a member died;
  // called by the liveness check for every group containing that member).
  void fail(absl::Status why) override;
  bool contains(int global_rank) const;
  // All-reduces done through shared memory so far (tests).
  std::uint64_t shared_memory_all_reduces() const { return shm_all_reduces_.load(); }
  // Tests: this member cannot make or open the shared memory segment at the
  // setup (as with a full /dev/shm), so the whole group keeps messages.
  void fail_shared_memory_for_test() { shm_fault_ = true; }

  // Records each collective's phases (reduce-scatter, all-gather, direct)
  // in `recorder` (outlives this; set before the first collective), as
  // events of the step set_trace_step last named. A phase's seq is its
  // collective's sequence number: 0, 1, ... in issue order (its messages'
  // tags carry it mod 2^16).
  void set_recorder(trace::Recorder* recorder) { recorder_ = recorder; }
  void set_trace_step(int step) { recorder_step_.store(step, std::memory_order_relaxed); }

 private:
  using Body = std::function<absl::Status()>;  // one collective, run by execute()
  absl::Status execute(const Body& run);       // holds run_mu_
  void enqueue(Body run, Callback done);       // on the worker, in issue order
  absl::Status run_now(Body run);              // inline if nothing is queued, else queued
  absl::Status failure();                      // OK, or why the communicator failed
  Body all_reduce_body(float* data, std::size_t n);
  Body reduce_scatter_body(const float* in, float* out, std::size_t n);
  Body all_gather_body(const float* in, float* out, std::size_t n);
  Body broadcast_body(float* data, std::size_t n, int root);
  Body reduce_body(const float* in, float* out, std::size_t n, int root);
  absl::Status phase(trace::What what, std::uint32_t op, std::size_t n,
                     const std::function<absl::Status()>& run);

  std::pair<std::size_t, std::size_t> chunks(std::size_t n, int a, int b) const;
  absl::Status halving_reduce_scatter(float* data, std::size_t n, std::uint32_t op);
  absl::Status doubling_all_gather(float* data, std::size_t n, std::uint32_t op,
                                   std::uint32_t step0);
  absl::Status ring_reduce_scatter(float* data, std::size_t n, std::uint32_t op);
  absl::Status ring_all_gather(float* data, std::size_t n, std::uint32_t op, std::uint32_t step0);
  absl::Status direct_all_reduce(float* data, std::size_t n, std::uint32_t op);
  absl::Status chain_broadcast(float* data, std::size_t n, int root, std::uint32_t op);
  // How the all-reduce of n floats sums (its algorithm: direct exchange,
  // halving, ring), whichever way its bytes travel.
  SumOrder sum_order(std::size_t n) const;
  // The all-reduce through shared memory (comm/communicator_shm.cc): whether
  // this group may take it, its setup at the first (false after a setup
  // that failed on any member: every member then keeps the transport), and
  // the all-reduce itself.
  bool shm_possible() const;
  absl::StatusOr<bool> shm_ready(std::uint32_t op);
  absl::Status shm_all_reduce(float* data, std::size_t n, std::uint32_t op);
  absl::Status gather_reduce(const float* in, float* out, std::size_t n, int root,
                             std::uint32_t op);  // comm/communicator_reduce.cc
  // Sends `n` floats to member `to` and receives `m` from member `from` into
  // `dest` (added to it or copied), both sliced. The sends stay in flight,
  // tagged with `step`, until wait_sends. Before anything is written into
  // `dest`, the sends of steps <= `written_after` are waited for (-1: none).
  enum class Combine { kAdd, kCopy };
  absl::Status exchange(int to, const float* send, std::size_t n, int from, float* dest,
                        std::size_t m, Combine how, std::uint32_t op, std::uint32_t step,
                        int written_after);
  absl::Status wait_sends(std::uint32_t step = ~0u);
  // The route of the running all-reduce's messages, of n floats: set before
  // its first message; execute() puts Route::kAny back after every
  // collective (the others keep it: only the all-reduce was measured).
  void set_route(std::size_t n) {
    route_ = size() <= 2 && n * sizeof(float) <= options_.copies_max_bytes ? Route::kCopies
                                                                           : Route::kAny;
  }

  Transport& transport_;
  trace::Recorder* recorder_ = nullptr;
  std::atomic<int> recorder_step_{0};
  std::vector<int> ranks_;
  GroupKind kind_;
  CommunicatorOptions options_;
  int me_ = -1;
  std::uint32_t next_op_ = 0;  // this and the state below: under run_mu_
  Route route_ = Route::kAny;
  std::shared_ptr<CancelToken> token_ = std::make_shared<CancelToken>();
  std::vector<float> scratch_;   // received slices that land before they are added
  std::vector<float> piece_;     // one piece read from a peer's memory, added in cache
  Transport* driver_ = nullptr;  // the transport, while a collective drives it
  struct StepSends;              // one step's sends
  std::deque<std::unique_ptr<StepSends>> sends_;  // in flight, oldest first
  enum class Shm { kUntried, kOn, kOff };
  Shm shm_state_ = Shm::kUntried;
  bool shm_fault_ = false;
  std::unique_ptr<ShmAllReduce> shm_;  // set once (also under mu_: fail() fails it)
  std::atomic<std::uint64_t> shm_all_reduces_{0};

  std::mutex run_mu_;  // held while a collective runs; guards next_op_ to sends_
  std::mutex mu_;
  absl::Status aborted_;
  int queued_ = 0;  // collectives issued and not finished (guarded by mu_)
  CallbackQueue worker_{
      "collective"};  // last: its thread runs collectives that use the members above
};

// `*bytes` of member `root` to every member of `group`, byte for byte (every
// member passes a string of the same size): a small blob, as NCCL's id.
absl::Status broadcast_bytes(Communicator& group, std::string* bytes, int root);

}  // namespace troupe::comm
