// The in-process transport: ranks are threads of one process. A message is
// copied once, straight from the sender's buffer into the receiver's (a send
// posted before its receive waits, without copying, until the receive comes).
// A pulled receive (recv_pull) copies nothing: the receiver reads the
// sender's buffer in place, and the send completes when it lets go.
// A rank's operations complete on the callback queue's thread (the one a
// rank posted last) or on the peer's thread that matched them (the one that
// waited); those a thread posts while it drives the rank (drive_begin ..
// drive_end, as a collective does) wait for its poll() instead and run
// there, so a collective's messages cost no hand-off to another thread (a
// 4 KiB all-reduce of two threads: 46 us through the queue, 9 driven).
//
//   auto fabric = std::make_shared<comm::InProcFabric>(4);
//   std::unique_ptr<comm::Transport> t0 = fabric->endpoint(0);   // rank 0's view
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/callback_queue.h"
#include "comm/transport.h"

namespace troupe::comm {

class InProcFabric : public std::enable_shared_from_this<InProcFabric> {
 public:
  explicit InProcFabric(int size);
  int size() const { return size_; }
  // Returns once the completions queued so far have run (before an owner
  // frees what their callbacks use: a rank's trace recorder).
  void drain() { callbacks_.drain(); }
  // Rank `rank`'s transport; keeps the fabric alive.
  std::unique_ptr<Transport> endpoint(int rank);
  // (peer, tag) entries of the matching tables, all ranks together: how many
  // distinct (source, tag) pairs have an unmatched send or receive waiting.
  // Tags carry step and sequence numbers, so a table that kept emptied
  // entries would grow with every step (a regression).
  std::size_t pending_entries();
  // Tests: the ranks report one another as sharing memory
  // (Transport::shares_memory_with), as processes of one host do, so that a
  // Communicator of two or more takes the shared memory all-reduce with
  // its members threads of this process. Set before the endpoints are used.
  void share_memory_for_test() { shares_memory_ = true; }
  bool shares_memory() const { return shares_memory_; }

 private:
  friend class InProcTransport;
  // A thread driving a rank (drive_begin .. drive_end): the completions of
  // the operations it posts meanwhile wait in `pending` for its own poll()
  // (the rank's other operations, a pipeline's receives, complete as ever).
  struct Driver {
    std::mutex mu;
    std::condition_variable cv;
    int depth = 0;  // drive_begin calls not yet ended; 0: done driving
    bool sleeping = false;
    std::deque<std::function<void()>> pending;
  };
  struct Op {
    int owner;  // the rank that posted it
    int peer;
    Tag tag;
    void* data;  // const for sends
    std::size_t bytes;
    Callback done;  // for a pulled receive: reports failures only
    std::shared_ptr<CancelToken> token;
    std::shared_ptr<ArrivalCallback> pulled = nullptr;  // a pulled receive's callback
    std::shared_ptr<Driver> driver = nullptr;           // the posting thread's, if it drives
  };
  using Key = std::pair<int, Tag>;  // (source rank, tag), per destination

  void send(int src, int dst, Tag tag, const void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token, std::shared_ptr<Driver> driver);
  void recv(int dst, int src, Tag tag, void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token, std::shared_ptr<Driver> driver);
  void recv_pull(int dst, int src, Tag tag, std::size_t bytes, ArrivalCallback done,
                 std::shared_ptr<CancelToken> token, std::shared_ptr<Driver> driver);
  void post(Op op, bool is_send);
  absl::Status refusal(const Op& op) const;
  void fail_peer(int rank, int peer, absl::Status why);
  void cancel(int rank, const std::shared_ptr<CancelToken>& token, absl::Status why);
  // Copies a matched pair and completes both (outside the lock): the one
  // posted last through the callback queue, the one that waited (a peer's)
  // in the calling thread.
  void deliver(Op send, Op recv, bool send_posted_last);
  // Completes an operation with `fn`: in its driver's poll while that thread
  // still drives; otherwise here (`here`: a waiting peer's, in the call that
  // matched it) or on the callback queue.
  void complete(const std::shared_ptr<Driver>& driver, std::function<void()> fn, bool here);
  // Removes `rank`'s pending ops that `pred` selects and fails them.
  template <typename Pred>
  void fail_where(int rank, Pred pred, const absl::Status& why);

  const int size_;
  bool shares_memory_ = false;
  std::mutex mu_;
  std::vector<std::map<Key, std::vector<Op>>> sends_;  // by destination: unmatched sends
  std::vector<std::map<Key, std::vector<Op>>> recvs_;  // by destination: posted receives
  std::vector<std::vector<absl::Status>> failed_;      // [rank][peer]: rank knows peer failed
  // A completion callback that threw (a bug of its owner): every pending
  // and later operation fails with it, so that whoever waits hears of it.
  void fail_everything(const absl::Status& why);
  // Runs a waiting peer's completion on this thread (see deliver).
  void run_inline(const std::function<void()>& fn);
  CallbackQueue callbacks_{"inproc", [this](const absl::Status& why) { fail_everything(why); }};
};

}  // namespace troupe::comm
