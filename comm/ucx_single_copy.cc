// The single-copy protocol of the UCX transport, between processes of one
// host: the sender posts a small descriptor (pid, address, length) and
// waits for an acknowledgement; the receiver reads the bytes with
// process_vm_readv (CMA) and acknowledges under the same tag with kAckBit
// (0, or the errno of a failed read). See comm/ucx_transport.h.
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/ucx_transport.h"

namespace troupe::comm {
namespace {

// The acknowledgement of `tag` by rank `acker`: the ack bit, and the source
// field naming the acknowledging rank, so acks from different peers of one
// tag (a direct all-reduce sends one tag to all) never stand in for each other.
Tag ack_tag(Tag tag, int acker) {
  return (tag & ~(Tag{0x7FFF} << 48)) | (static_cast<Tag>(acker & 0x7FFF) << 48) | kAckBit;
}

// What the sender of a single-copy message tells the receiver.
struct CopyDescriptor {
  std::uint64_t address;
  std::uint64_t bytes;
  std::int32_t pid;
  std::int32_t pad;
};

}  // namespace

// Single copy, sender side: the descriptor goes out; the send completes
// when the receiver acknowledges its copy (0) or reports an error (errno),
// or when the descriptor could not be sent (a regression: that status was
// once dropped, and the sender waited for an acknowledgement that could
// never come). Whichever comes first reports; the other is ignored.
void UcxTransport::send(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
                        std::shared_ptr<CancelToken> token, Route route) {
  if (route == Route::kCopies || !single_copy(peer, bytes)) {
    send_ucx(peer, tag, data, bytes, std::move(done), std::move(token));
    return;
  }
  struct State {
    CopyDescriptor desc;
    std::int64_t ack = -1;
    std::atomic<bool> reported{false};
    Callback done;
  };
  auto state = std::make_shared<State>();
  state->desc = {reinterpret_cast<std::uint64_t>(data), bytes,
                 static_cast<std::int32_t>(::getpid()), 0};
  state->done = std::move(done);
  auto report = [](State& s, absl::Status st) {
    if (!s.reported.exchange(true)) s.done(std::move(st));
  };
  // Cancelled (our communicator failed), the send still waits for the
  // acknowledgement, up to the cancel bound: a live receiver may be reading
  // the buffer, which the caller may reuse once the send completes.
  const std::uint64_t ack_id = recv_ucx(
      peer, ack_tag(tag, peer), &state->ack, sizeof state->ack,
      [state, report, peer](absl::Status st) {
        if (st.ok() && state->ack != 0) {
          st = absl::UnavailableError(absl::StrCat("rank ", peer, " could not copy the message: ",
                                                   std::strerror(static_cast<int>(state->ack))));
        }
        report(*state, std::move(st));
      },
      token, /*hold_on_cancel=*/true, state);
  send_ucx(
      peer, tag, &state->desc, sizeof state->desc,
      [this, state, report, peer, ack_id, token](absl::Status st) {
        // Cancelled, the descriptor may have been delivered all the same (a
        // cancel reports this callback with the cancel's reason): the held
        // acknowledgement decides, within the cancel bound, not this.
        if (st.ok() || (token && token->cancelled)) return;
        // The receiver never heard of the message: nobody reads the buffer.
        absl::Status why(st.code(), absl::StrCat("single-copy send to rank ", peer,
                                                 ": the descriptor was not sent: ", st.message()));
        abandon(ack_id, why);
        report(*state, why);
      },
      token, Kind::kCopyDescriptor, state);
}

// Single copy, receiver side: the sender's bytes, read with
// process_vm_readv by whichever thread reads them. A sender that died makes
// the read fail (ESRCH), softly. Releasing acknowledges: 0, or the errno of
// the failed read (or ECANCELED: the receiver gave up), which fails the send.
class SingleCopySource final : public Arrival::Source {
 public:
  SingleCopySource(UcxTransport* transport, int peer, Tag tag, CopyDescriptor desc)
      : transport_(transport), peer_(peer), tag_(tag), desc_(desc) {}
  const void* data() const override { return nullptr; }
  absl::Status read(std::size_t offset, void* to, std::size_t bytes) override {
    for (std::size_t got = 0; got < bytes;) {
      iovec local{static_cast<char*>(to) + got, bytes - got};
      iovec remote{reinterpret_cast<void*>(desc_.address + offset + got), bytes - got};
      const ssize_t n = ::process_vm_readv(desc_.pid, &local, 1, &remote, 1, 0);
      if (n <= 0) {
        error_ = errno != 0 ? errno : EIO;
        return absl::UnavailableError(
            absl::StrCat("copy from rank ", peer_, " failed: ", std::strerror(error_)));
      }
      got += static_cast<std::size_t>(n);
    }
    transport_->single_copy_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    transport_->single_copy_from_[static_cast<std::size_t>(peer_)].fetch_add(
        bytes, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  void refuse(int error) { error_ = error; }
  void release(absl::Status receiver_status) override {
    auto ack = std::make_shared<std::int64_t>(error_ != 0            ? error_
                                              : receiver_status.ok() ? 0
                                                                     : ECANCELED);
    // No cancel token: a receiver whose collective has failed must still tell
    // the sender it is done with the buffer (a regression: the cancel that
    // followed a failed read swallowed the acknowledgement and the live
    // sender waited for ever). A dead sender fails it through fail_peer.
    // An acknowledgement that cannot be sent leaves the sender waiting: the
    // link is broken, so the sender is marked failed here (a regression:
    // that status was once dropped), and the owner's supervision, seeing
    // this rank's operations with it fail, stops the job.
    UcxTransport* t = transport_;
    const int peer = peer_;
    t->send_ucx(
        peer, ack_tag(tag_, t->rank_), ack.get(), sizeof *ack,
        [t, peer](absl::Status st) {
          if (st.ok()) return;
          t->fail_peer(peer, absl::UnavailableError(
                                 absl::StrCat("rank ", peer,
                                              " cannot be told that its single-copy message "
                                              "was read (the acknowledgement failed: ",
                                              st.message(), ")")));
        },
        nullptr, UcxTransport::Kind::kCopyAck, ack);
  }

 private:
  UcxTransport* transport_;
  int peer_;
  Tag tag_;
  CopyDescriptor desc_;
  int error_ = 0;
};

void UcxTransport::pull_single_copy(int peer, Tag tag, std::size_t bytes, ArrivalCallback done,
                                    std::shared_ptr<CancelToken> token) {
  auto desc = std::make_shared<CopyDescriptor>();
  recv_ucx(
      peer, tag, desc.get(), sizeof *desc,
      [this, desc, peer, tag, bytes, done = std::move(done)](absl::Status st) {
        if (!st.ok()) return done(Arrival(st, bytes, nullptr));
        auto source = std::make_unique<SingleCopySource>(this, peer, tag, *desc);
        if (desc->bytes != bytes) {
          source->refuse(EMSGSIZE);  // the sender hears EMSGSIZE; the receiver, the lengths
          source->release(absl::OkStatus());
          return done(Arrival(absl::InvalidArgumentError(
                                  absl::StrCat("message of ", desc->bytes, " bytes from rank ",
                                               peer, " for a receive of ", bytes, " bytes")),
                              bytes, nullptr));
        }
        done(Arrival(absl::OkStatus(), bytes, std::move(source)));
      },
      token, /*hold_on_cancel=*/false, desc);
}

void UcxTransport::recv_pull(int peer, Tag tag, std::size_t bytes, void* landing,
                             ArrivalCallback done, std::shared_ptr<CancelToken> token,
                             Route route) {
  if (route == Route::kCopies || !single_copy(peer, bytes)) {
    return Transport::recv_pull(peer, tag, bytes, landing, std::move(done), std::move(token),
                                route);
  }
  pull_single_copy(peer, tag, bytes, std::move(done), std::move(token));
}

// A plain receive by single copy: when the descriptor arrives, the copy
// thread reads the whole message (a regression: the progress thread once
// read it inside UCX's completion, stalling every other operation for as
// long as the copy took).
void UcxTransport::recv(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
                        std::shared_ptr<CancelToken> token, Route route) {
  if (route == Route::kCopies || !single_copy(peer, bytes)) {
    // A receive by copies (small, or Route::kCopies) for a message the
    // sender sent by single copy (a size mismatch) takes its descriptor and
    // fails; the sender, waiting for an acknowledgement, would wait for ever:
    // tell it (EMSGSIZE). Where the message was not a descriptor, the stray
    // acknowledgement is never matched.
    if (single_copy(peer, kSingleCopyMin)) {
      done = [this, peer, tag, done = std::move(done)](absl::Status st) {
        if (absl::IsInvalidArgument(st)) {
          auto ack = std::make_shared<std::int64_t>(EMSGSIZE);
          send_ucx(
              peer, ack_tag(tag, rank_), ack.get(), sizeof *ack, [ack](absl::Status) {}, nullptr,
              Kind::kCopyAck, ack);
        }
        done(std::move(st));
      };
    }
    recv_ucx(peer, tag, data, bytes, std::move(done), std::move(token));
    return;
  }
  pull_single_copy(
      peer, tag, bytes,
      [this, data, bytes, done = std::move(done)](Arrival message) mutable {
        if (!message.status().ok()) return done(message.status());
        auto held = std::make_shared<Arrival>(std::move(message));
        CallbackQueue* copier = nullptr;
        {
          std::lock_guard<std::mutex> lock(mu_);
          copier = copier_.get();  // gone once the destructor has drained it
        }
        if (copier == nullptr) {
          const absl::Status why = absl::AbortedError(absl::StrCat(
              "rank ", rank_, "'s UCX transport was shut down before the message was read"));
          held->release(why);
          return complete(done, why);
        }
        copier->post([this, held, data, bytes, done = std::move(done)]() mutable {
          absl::Status st = held->read(0, data, bytes);
          held->release(st);
          complete(done, std::move(st));
          const std::uint64_t one = 1;  // a driver asleep in wait_for_event looks again
          (void)!::write(wake_fd_, &one, sizeof one);
        });
      },
      std::move(token));
}

}  // namespace troupe::comm
