// Recording every message a rank's transport carries (comm/traced_transport.h).
#include "comm/traced_transport.h"

#include <algorithm>

namespace troupe::comm {

int unwrap_step(std::uint32_t low16, int near) {
  const int diff = static_cast<std::int16_t>(
      static_cast<std::uint16_t>(low16 - static_cast<std::uint32_t>(near)));
  return std::max(0, near + diff);
}

trace::Recorder::Handle TracedTransport::open(trace::Kind kind, int peer, Tag tag,
                                              std::size_t bytes) {
  const TagFields f = parse_tag(tag);
  trace::Event e;
  e.kind = kind;
  e.peer = peer;
  e.tag = tag;
  e.bytes = static_cast<std::int64_t>(bytes);
  const int now = step_ != nullptr ? step_->load(std::memory_order_relaxed) : 0;
  // A collective's tag holds its sequence number where a step would be (a
  // channel's, comm/stream_channel.h, its own).
  const bool collective = f.kind == MessageKind::kCollective || f.kind == MessageKind::kControl ||
                          f.group == GroupKind::kChannel;
  if (collective) {
    e.step = now;
    e.seq = static_cast<std::int32_t>(f.step);
  } else {
    e.step = step_ != nullptr ? unwrap_step(f.step, now) : static_cast<std::int32_t>(f.step);
    e.micro = static_cast<std::int32_t>(f.micro);
    e.chunk = static_cast<std::int32_t>(f.chunk);
    e.layer = static_cast<std::int32_t>(f.layer);
  }
  return recorder_->open(e);
}

// `done`, after the event of handle `h` is closed (failed on an error).
Callback TracedTransport::closing(trace::Recorder::Handle h, Callback done) const {
  return [rec = recorder_, h, done = std::move(done)](absl::Status st) {
    rec->close(h, !st.ok());
    done(std::move(st));
  };
}

void TracedTransport::send(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
                           std::shared_ptr<CancelToken> token, Route route) {
  inner_->send(peer, tag, data, bytes,
               closing(open(trace::Kind::kSend, peer, tag, bytes), std::move(done)),
               std::move(token), route);
}

void TracedTransport::recv(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
                           std::shared_ptr<CancelToken> token, Route route) {
  inner_->recv(peer, tag, data, bytes,
               closing(open(trace::Kind::kRecv, peer, tag, bytes), std::move(done)),
               std::move(token), route);
}

void TracedTransport::recv_pull(int peer, Tag tag, std::size_t bytes, void* landing,
                                ArrivalCallback done, std::shared_ptr<CancelToken> token,
                                Route route) {
  const trace::Recorder::Handle h = open(trace::Kind::kRecv, peer, tag, bytes);
  inner_->recv_pull(
      peer, tag, bytes, landing,
      [rec = recorder_, h, done = std::move(done)](Arrival a) {
        rec->close(h, !a.status().ok());
        done(std::move(a));
      },
      std::move(token), route);
}

}  // namespace troupe::comm
