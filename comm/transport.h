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
//
// A receive can also leave the bytes where they are until the receiver
// wants them (recv_pull): where the sender's memory is reachable (in-process,
// or a process of this host), the receiver reads it piece by piece on its
// own thread, each piece used while it is in cache (a ring adds it), and no
// thread of the transport copies anything. Elsewhere, and with
// Route::kCopies, the bytes land in the receiver's `landing` buffer as a
// plain receive would put them.
//
//   transport.recv_pull(peer, tag, n, landing, [&](Arrival a) { ... }, token);
//   // later, on the receiver's thread:
//   if (a.data()) use(a.data()); else a.read(offset, piece, bytes); ...
//   a.release();  // the sender's send completes
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "comm/tag.h"

namespace troupe::comm {

using Callback = std::function<void(absl::Status)>;

// A message that has arrived but may still be in the sender's memory; see
// recv_pull. Movable, not copyable; releasing it (explicitly or by
// destruction) completes the sender's send: OK, or the receiver's error.
class Arrival {
 public:
  // How the bytes are reached: a pointer this process can read (in-process
  // zero copy, or the landing buffer), or `read` on the sender's memory.
  struct Source {
    virtual ~Source() = default;
    virtual const void* data() const = 0;  // nullptr: use read()
    virtual absl::Status read(std::size_t offset, void* to, std::size_t bytes) = 0;
    virtual void release(absl::Status receiver_status) = 0;
  };
  Arrival() = default;
  Arrival(absl::Status status, std::size_t bytes, std::unique_ptr<Source> source)
      : status_(std::move(status)), bytes_(bytes), source_(std::move(source)) {}
  Arrival(Arrival&&) = default;
  Arrival& operator=(Arrival&& other) {
    if (this != &other) {
      release();
      status_ = std::move(other.status_);
      bytes_ = other.bytes_;
      source_ = std::move(other.source_);
    }
    return *this;
  }
  ~Arrival() { release(); }

  // OK when the message is there to be read; otherwise why not (the peer
  // failed, the operation was cancelled, a length mismatch).
  const absl::Status& status() const { return status_; }
  std::size_t bytes() const { return bytes_; }
  // The whole message, readable in place, or nullptr (use read()).
  const void* data() const { return source_ ? source_->data() : nullptr; }
  // Copies [offset, offset + n) of the message into `to`.
  absl::Status read(std::size_t offset, void* to, std::size_t n) {
    if (!status_.ok()) return status_;
    if (offset + n > bytes_) return absl::OutOfRangeError("read past the end of a message");
    if (!source_) return absl::FailedPreconditionError("read of a released message");
    if (const void* d = data()) {
      if (n > 0) std::memcpy(to, static_cast<const char*>(d) + offset, n);
      return absl::OkStatus();
    }
    return source_->read(offset, to, n);
  }
  // Done with the bytes; `receiver_status` tells the sender how it went.
  void release(absl::Status receiver_status = absl::OkStatus()) {
    if (source_) {
      auto source = std::move(source_);
      source->release(std::move(receiver_status));
    }
  }

 private:
  absl::Status status_;
  std::size_t bytes_ = 0;
  std::unique_ptr<Source> source_;
};

using ArrivalCallback = std::function<void(Arrival)>;

// Operations posted with the same token can be cancelled together.
struct CancelToken {
  std::atomic<bool> cancelled{false};
};

// How a message's bytes may travel between processes of one host, where a
// transport has a choice (UcxTransport: its single-copy protocol from 64
// KiB, or copies through shared memory). The sender and the receiver of a
// message must give the same. Where they do not, the receive fails and the
// send may not: a receive by copies of a single-copy descriptor fails with
// InvalidArgument and fails the send too (EMSGSIZE); a single-copy receive
// of copied bytes fails (truncated) while the send completes OK.
enum class Route {
  kAny,     // the transport's choice, by size
  kCopies,  // copies through shared memory: no round trip before the bytes
            // move, for bytes that stay in cache (a small all-reduce's)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // `data` must stay valid until `done` runs. A receive must be for exactly
  // the number of bytes sent (a mismatch completes with InvalidArgument).
  virtual void send(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
                    std::shared_ptr<CancelToken> token = nullptr, Route route = Route::kAny) = 0;
  virtual void recv(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
                    std::shared_ptr<CancelToken> token = nullptr, Route route = Route::kAny) = 0;

  // Receives `bytes` from `peer` without copying them yet (see above):
  // `done` runs on a transport thread, under the same rules as a receive's
  // callback, with the message or the reason there is none. `landing`
  // (`bytes` long, valid until the Arrival is released) receives the bytes
  // where they cannot be read in place. This default is a plain receive into
  // `landing`.
  virtual void recv_pull(int peer, Tag tag, std::size_t bytes, void* landing, ArrivalCallback done,
                         std::shared_ptr<CancelToken> token = nullptr, Route route = Route::kAny);

  // Caller-driven progress, where a transport offers it (can_poll()):
  // between drive_begin() and drive_end() the calling thread makes the
  // transport progress by calling poll() while it waits or between pieces of
  // its own work (completions then run on that thread, inside poll); the
  // transport's own thread stands down, so there is no handoff. poll()
  // returns whether anything happened. Elsewhere these do nothing and the
  // transport's threads complete operations.
  virtual bool can_poll() const { return false; }
  virtual bool poll() { return false; }
  // A driver with nothing to do may sleep until the transport has an event
  // to progress or `max` has passed; false where it cannot (then it polls).
  virtual bool wait_for_event(std::chrono::microseconds /*max*/) { return false; }
  virtual void drive_begin() {}
  virtual void drive_end() {}

  // Whether `peer` is another process of this host that maps the same POSIX
  // shared memory (/dev/shm) as this one: a group of such processes may
  // all-reduce through one segment (comm/shm_all_reduce.h).
  virtual bool shares_memory_with(int /*peer*/) const { return false; }

  // Marks `peer` failed (fed by a liveness check of the control plane).
  virtual void fail_peer(int peer, absl::Status why) = 0;
  // Completes every pending operation posted with `token` with `why`.
  virtual void cancel(const std::shared_ptr<CancelToken>& token, absl::Status why) = 0;
};

// Drives `t` (null: nothing) for a scope: drive_begin() now, drive_end()
// when the scope ends, also by an exception (a transport left driven would
// hold its completions for a poll that never comes).
class DriveScope {
 public:
  explicit DriveScope(Transport* t) : t_(t) {
    if (t_ != nullptr) t_->drive_begin();
  }
  ~DriveScope() {
    if (t_ != nullptr) t_->drive_end();
  }
  DriveScope(const DriveScope&) = delete;
  DriveScope& operator=(const DriveScope&) = delete;

 private:
  Transport* t_;
};

// An Arrival whose bytes are in a buffer of this process.
class InPlaceSource final : public Arrival::Source {
 public:
  explicit InPlaceSource(const void* data, Callback on_release = nullptr)
      : data_(data), on_release_(std::move(on_release)) {}
  const void* data() const override { return data_; }
  absl::Status read(std::size_t, void*, std::size_t) override { return absl::OkStatus(); }
  void release(absl::Status st) override {
    if (on_release_) on_release_(std::move(st));
  }

 private:
  const void* data_;
  Callback on_release_;
};

inline void Transport::recv_pull(int peer, Tag tag, std::size_t bytes, void* landing,
                                 ArrivalCallback done, std::shared_ptr<CancelToken> token,
                                 Route route) {
  recv(
      peer, tag, landing, bytes,
      [landing, bytes, done = std::move(done)](absl::Status st) {
        done(Arrival(st, bytes, st.ok() ? std::make_unique<InPlaceSource>(landing) : nullptr));
      },
      std::move(token), route);
}

}  // namespace troupe::comm
