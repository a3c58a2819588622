// A Transport that records every message it carries (comm/trace.h) and
// passes everything else through to the transport it wraps.
//
// A send or receive is an open event from its post until its callback runs
// (send: the bytes have left; receive: they have arrived); the tag says what
// it is (kind, step, micro-batch, chunk, layer), so the callers need not.
// The merged trace matches the send on rank A to peer B with tag X to the
// receive on B from A with tag X.
//
//   auto t = std::make_unique<comm::TracedTransport>(std::move(ucx), recorder);
#pragma once

#include <atomic>
#include <memory>

#include "comm/trace.h"
#include "comm/transport.h"

namespace troupe::comm {

class TracedTransport final : public Transport {
 public:
  // `recorder` outlives this transport and every callback it runs; so does
  // `step` (may be null), the step the rank is in: a tag carries the step
  // mod 2^16 (a collective's none), the event gets the full one (the
  // nearest to *step with those low 16 bits; a collective's: *step).
  TracedTransport(std::unique_ptr<Transport> inner, trace::Recorder* recorder,
                  const std::atomic<int>* step = nullptr)
      : inner_(std::move(inner)), recorder_(recorder), step_(step) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void send(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token = nullptr, Route route = Route::kAny) override;
  void recv(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token = nullptr, Route route = Route::kAny) override;
  void recv_pull(int peer, Tag tag, std::size_t bytes, void* landing, ArrivalCallback done,
                 std::shared_ptr<CancelToken> token = nullptr, Route route = Route::kAny) override;
  bool can_poll() const override { return inner_->can_poll(); }
  bool poll() override { return inner_->poll(); }
  bool wait_for_event(std::chrono::microseconds max) override {
    return inner_->wait_for_event(max);
  }
  void drive_begin() override { inner_->drive_begin(); }
  void drive_end() override { inner_->drive_end(); }
  bool shares_memory_with(int peer) const override { return inner_->shares_memory_with(peer); }
  void fail_peer(int peer, absl::Status why) override { inner_->fail_peer(peer, std::move(why)); }
  void cancel(const std::shared_ptr<CancelToken>& token, absl::Status why) override {
    inner_->cancel(token, std::move(why));
  }

  Transport& inner() { return *inner_; }

 private:
  trace::Recorder::Handle open(trace::Kind kind, int peer, Tag tag, std::size_t bytes);
  Callback closing(trace::Recorder::Handle h, Callback done) const;

  std::unique_ptr<Transport> inner_;
  trace::Recorder* recorder_;
  const std::atomic<int>* step_;
};

// The step whose low 16 bits are `low16` nearest to `near` (>= 0).
int unwrap_step(std::uint32_t low16, int near);

}  // namespace troupe::comm
