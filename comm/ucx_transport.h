// The UCX transport: ranks are processes, on one host or many. Messages go
// through UCP's tag API (shared memory within a host, TCP across hosts);
// the tag layout of comm/tag.h carries the sender.
//
// Peer failure: UCX's peer-failure mode would disable shared memory, so
// endpoints run without it and dead peers are detected out of band: the
// liveness check of the control plane (comm/bootstrap.h for now) calls
// fail_peer(), which fails every pending operation with that peer.
//
// Large messages between processes of one host (unless both sides give
// Route::kCopies) take a single copy of our own: the sender posts a small
// descriptor (pid, address, length), the receiver copies with
// process_vm_readv (CMA) and acknowledges under the same tag with kAckBit.
// UCX's own CMA transport stays off because a copy from a peer that has
// just died is fatal inside UCX; ours fails that one receive with an error
// instead.
//
// Every failure reaches the side that waits: a failed descriptor send fails
// the send (and gives up its acknowledgement's receive); a failed
// acknowledgement marks the sender failed on the receiver (its operations
// with that rank fail, and the owner's supervision stops the job, which
// tells the sender). A plain receive by single copy is read on a copy thread
// of its own, never on the thread that progresses UCX.
//
// Destroying the transport completes every pending operation (Aborted). A
// completion callback that throws fails every operation of the transport,
// pending and later (Internal, naming the exception), instead of ending the
// process.
//
// A caller posts its own operation where it can take the worker at once
// (what completes during that post is the progress thread's to report);
// otherwise it queues it and a progress thread posts it. That thread polls UCX while
// any are in flight (yielding the core between polls, then backing off after
// ~10 ms of quiet) and sleeps on a condition variable when nothing is
// pending, so an idle transport burns no core. A collective's thread may
// drive progress itself instead (drive_begin, poll, drive_end: see
// comm/transport.h); the progress thread stands down meanwhile, and one
// thread does the reading, adding and polling with no handoff, as MPI's
// caller-driven progress does. UCX's worker is used by one thread at a time
// (worker_mu_).
//
//   auto t = comm::UcxTransport::create(rank, size);
//   auto addresses = bootstrap->all_gather((*t)->address());
//   RETURN_IF_ERROR((*t)->connect(*addresses));
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/callback_queue.h"
#include "comm/transport.h"

namespace troupe::comm {

struct UcxOptions {
  // Every rank of the world runs on this host (a launcher's
  // LOCAL_WORLD_SIZE is its world size): UCX gets its shared-memory
  // transports alone. Otherwise its TCP transport, which carries nothing
  // between processes of one host, is polled by every progress call (two
  // epoll_wait system calls: a third of a 2-process all-reduce of 64 KiB on
  // this 2-core machine). connect() refuses a peer on another host, naming
  // it and `because`. UCX_TLS, where set, stands (and nothing is refused).
  bool one_host = false;
  std::string because = "";  // what said so ("LOCAL_WORLD_SIZE=4"), for that error
};

class UcxTransport final : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<UcxTransport>> create(int rank, int size,
                                                              UcxOptions options = {});
  ~UcxTransport() override;

  // This rank's address (pid, host and UCX worker address), to be
  // exchanged with every peer.
  const std::string& address() const { return address_; }
  // Messages of at least this many bytes to a process on this host go by
  // the single-copy protocol (unless Route::kCopies).
  static constexpr std::size_t kSingleCopyMin = 64 << 10;
  // Bytes received so far by the single-copy protocol (0 where the host
  // does not allow it: see single_copy_possible() in ucx_transport.cc).
  std::uint64_t single_copy_bytes() const {
    return single_copy_bytes_.load(std::memory_order_relaxed);
  }
  // Of those, the bytes read from `peer` (0 for a peer on another host).
  std::uint64_t single_copy_bytes_from(int peer) const {
    return peer >= 0 && peer < size_
               ? single_copy_from_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed)
               : 0;
  }
  // Which UCX transports reach each peer, and whether the single-copy
  // protocol applies to it, one entry per rank after connect():
  //   "rank 0: sysv/memory tcp/eth0 tcp/lo; rank 1: sysv/memory tcp/eth0 tcp/lo
  //    (single copy on, 65536 bytes); rank 2: tcp/eth0 (single copy off, 0 bytes)"
  // (on one line; here rank 0 is this one, 1 on this host, 2 on another;
  // with UcxOptions::one_host a peer shows sysv/memory alone).
  // The transports are the endpoint's lanes as UCX chose them from the
  // peer's address (ucp_ep_print_info): a peer on another host shows tcp
  // alone. For logs and tests (tests/launcher/multihost_test.py).
  std::string describe_lanes();
  // Endpoints to every rank (address[r] of rank r, this one included).
  absl::Status connect(const std::vector<std::string>& addresses);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Route::kCopies: UCX's eager copies through shared memory, never the
  // single-copy protocol.
  void send(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token, Route route = Route::kAny) override;
  void recv(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token, Route route = Route::kAny) override;
  void recv_pull(int peer, Tag tag, std::size_t bytes, void* landing, ArrivalCallback done,
                 std::shared_ptr<CancelToken> token, Route route = Route::kAny) override;
  void fail_peer(int peer, absl::Status why) override;
  bool can_poll() const override { return true; }
  bool shares_memory_with(int peer) const override {
    return peer != rank_ && peer >= 0 && static_cast<std::size_t>(peer) < same_place_.size() &&
           same_place_[static_cast<std::size_t>(peer)];
  }
  bool poll() override;
  bool wait_for_event(std::chrono::microseconds max) override;
  void drive_begin() override;
  void drive_end() override;
  void cancel(const std::shared_ptr<CancelToken>& token, absl::Status why) override;

  // Operations posted and not yet reported (tests: nothing is left behind).
  std::size_t pending_operations();
  // Tests: the next `count` posts of this kind fail as if UCX had refused
  // them (a dead link), so that the failure paths of the single-copy
  // protocol run for real.
  enum class Fault { kCopyDescriptorSend, kCopyAckSend };
  void inject_fault_for_test(Fault where, int count = 1);

  // What a message is, for the protocol (and fault injection).
  enum class Kind : std::uint8_t { kData, kCopyDescriptor, kCopyAck };
  // One pending operation.
  struct Op {
    UcxTransport* transport;
    int peer;
    bool is_send;
    std::size_t bytes;
    Callback done;
    std::shared_ptr<CancelToken> token;
    Tag tag = 0;
    void* data = nullptr;
    void* request = nullptr;      // UCX's request, once the post call has returned
    bool in_ucx = false;          // posted to UCX and its completion not yet seen
    bool finished = false;        // failed outside UCX: the user's callback is queued
    bool callback_taken = false;  // that callback has been taken to run
    bool posting = false;         // inside ucp_tag_*_nbx (which may complete it at once)
    bool completed_in_post = false;
    absl::Status post_status = absl::OkStatus();
    bool wait_for_ucx = false;    // cancelled: report when UCX lets go of the buffer
    bool hold_on_cancel = false;  // cancelled: stay posted until done or the bound (acks)
    bool peer_dead = false;       // its peer failed: nothing is held for it
    bool ucx_cancelled = false;   // ucp_request_cancel called on its request
    bool cancel_sent = false;
    std::chrono::steady_clock::time_point give_up_at = {};
    Kind kind = Kind::kData;
    std::uint64_t id = 0;                  // unique per transport (addresses are reused)
    std::shared_ptr<void> keep = nullptr;  // owner of `data`, kept until UCX lets go of it
  };

 private:
  UcxTransport(int rank, int size)
      : rank_(rank),
        size_(size),
        single_copy_from_(std::make_unique<std::atomic<std::uint64_t>[]>(
            static_cast<std::size_t>(std::max(size, 0)))) {}
  void progress_loop();
  bool progress_once(bool* idle);                // holds worker_mu_
  std::uint64_t submit(std::unique_ptr<Op> op);  // returns the op's id
  // Straight through UCX (queued for the progress thread); the op's id.
  std::uint64_t send_ucx(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
                         std::shared_ptr<CancelToken> token, Kind kind = Kind::kData,
                         std::shared_ptr<void> keep = nullptr);
  std::uint64_t recv_ucx(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
                         std::shared_ptr<CancelToken> token, bool hold_on_cancel = false,
                         std::shared_ptr<void> keep = nullptr);
  // Fails operation `id` if it is still pending (its peer is not waited for).
  void abandon(std::uint64_t id, const absl::Status& why);
  // Runs a completion callback; one that throws fails the whole transport.
  void complete(Callback& done, absl::Status st);
  bool consume_fault(Kind kind);
  void wake_locked();  // holds mu_
  bool single_copy(int peer, std::size_t bytes) const {
    return bytes >= kSingleCopyMin && peer != rank_ && peer >= 0 && peer < size_ &&
           static_cast<std::size_t>(peer) < same_host_.size() &&
           same_host_[static_cast<std::size_t>(peer)];
  }
  // Single copy, receiver side: the descriptor arrives; the bytes stay with
  // the sender until read.
  void pull_single_copy(int peer, Tag tag, std::size_t bytes, ArrivalCallback done,
                        std::shared_ptr<CancelToken> token);
  friend class SingleCopySource;
  void post_queued(std::vector<Op*>& queued);
  // Posts what is queued on the calling thread if it can take the worker
  // at once (submit's fast path), then wakes the progress thread.
  void post_here();
  // Runs a completion's callback, or leaves it to the progress thread
  // (posting_here).
  void complete_or_defer(std::unique_ptr<Op> op, absl::Status st);
  bool work_queued_locked() const {  // holds mu_
    return !to_post_.empty() || !to_fail_.empty() || !to_complete_.empty();
  }
  void finish(Op* op, absl::Status st);  // the worker's holder, inside UCX
  template <typename Pred>
  void fail_where(Pred pred, const absl::Status& why, bool wait_for_ucx);
  friend void ucx_send_done(void*, int, void*);
  friend void ucx_recv_done(void*, int, const void*, void*);

  const int rank_, size_;
  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  int event_fd_ = -1;        // the worker's event descriptor (UCP_FEATURE_WAKEUP)
  std::vector<void*> eps_;   // ucp_ep_h per rank
  std::string address_;
  bool cma_allowed_ = false;  // peers may read our memory (Yama scope <= 1)
  bool one_host_ = false;     // UcxOptions::one_host, UCX_TLS unset
  std::string one_host_because_;
  std::vector<bool> same_host_;   // per rank: the single-copy protocol applies
  std::vector<bool> same_place_;  // per rank: this host and pid namespace

  std::mutex worker_mu_;  // whoever holds it may use the UCX worker
  std::mutex mu_;
  std::condition_variable cv_;
  int drivers_ = 0;   // threads driving progress themselves (guarded by mu_)
  int sleepers_ = 0;  // asleep in wait_for_event: drivers, the progress thread (mu_)
  int wake_fd_ = -1;  // eventfd that wakes them
  std::unordered_map<Op*, std::unique_ptr<Op>> ops_;
  std::vector<Op*> to_post_;  // queued for the worker's next holder to post
  std::vector<Op*> to_fail_;  // failed by fail_peer/cancel, callbacks not yet run
  // Completed while a caller posted (posting_here), callbacks not yet run.
  std::vector<std::pair<std::unique_ptr<Op>, absl::Status>> to_complete_;
  std::vector<Op*> deferred_;         // cancelled, waiting for UCX to let go (bounded)
  std::vector<absl::Status> failed_;  // per peer
  std::uint64_t next_id_ = 1;         // guarded by mu_
  bool closing_ = false;              // destructor running: posts are refused (mu_)
  std::atomic<int> fault_desc_{0}, fault_ack_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> single_copy_bytes_{0};
  std::unique_ptr<std::atomic<std::uint64_t>[]> single_copy_from_;  // (size_): by peer
  std::thread progress_;
  // Reads of plain single-copy receives (process_vm_readv of a whole
  // message): off the progress thread, which would stall every other
  // operation meanwhile. Declared last: destroyed (drained) first.
  std::unique_ptr<CallbackQueue> copier_ = std::make_unique<CallbackQueue>("ucx-copier");
};

}  // namespace troupe::comm
