// Transports move bytes between ranks, asynchronously, by tag.
//
// A send or receive completes through its callback, exactly once, on a
// thread of the transport: its progress thread, or (in-process) the thread
// of the peer's call that matched it, but never inside the call that posted
// it. Callbacks may run concurrently; each must be safe for that. OK
// when the bytes have left the buffer (send) or arrived (receive), an error
// when the peer has failed or the operation was cancelled. A callback must not
// block; an actor turns it into a message to itself.
//
//   transport.recv(peer, tag, buf, n, [&](absl::Status st) { ... });
//   transport.send(peer, tag, buf, n, [&](absl::Status st) { ... });
//
// Failure is an error completion, never a hang: fail_peer(r) completes every
// pending operation with r (and every later one) with Unavailable, and
// cancel(token) completes every pending operation posted with that token
// (a communicator aborts its collectives this way, including operations with
// live peers of a ring that one dead member has stalled).
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "comm/tag.h"

namespace troupe::comm {

using Callback = std::function<void(absl::Status)>;

// Operations posted with the same token can be cancelled together.
struct CancelToken {
  std::atomic<bool> cancelled{false};
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // `data` must stay valid until `done` runs. A receive must be for exactly
  // the number of bytes sent (a mismatch completes with InvalidArgument).
  virtual void send(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
                    std::shared_ptr<CancelToken> token = nullptr) = 0;
  virtual void recv(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
                    std::shared_ptr<CancelToken> token = nullptr) = 0;

  // Marks `peer` failed (fed by a liveness check of the control plane).
  virtual void fail_peer(int peer, absl::Status why) = 0;
  // Completes every pending operation posted with `token` with `why`.
  virtual void cancel(const std::shared_ptr<CancelToken>& token, absl::Status why) = 0;
};

}  // namespace troupe::comm
