// In-order channels over a transport, waited for on the stream's thread.
#include "comm/stream_channel.h"

#include <cstdint>
#include <future>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace troupe::comm {
namespace {

class TransportChannel final : public StreamPointToPoint {
 public:
  TransportChannel(Transport* t, MessageKind kind) : t_(t), kind_(kind) {}

  absl::Status send_on(void* stream, const void* data, std::size_t bytes, int peer) override {
    if (absl::Status st = check(stream, peer); !st.ok()) return st;
    const Tag tag = channel_tag(t_->rank(), next(&sent_, peer));
    return wait([&](Callback done) { t_->send(peer, tag, data, bytes, std::move(done)); }, "send",
                peer);
  }
  absl::Status recv_on(void* stream, void* data, std::size_t bytes, int peer) override {
    if (absl::Status st = check(stream, peer); !st.ok()) return st;
    const Tag tag = channel_tag(peer, next(&received_, peer));
    return wait([&](Callback done) { t_->recv(peer, tag, data, bytes, std::move(done)); },
                "receive", peer);
  }

 private:
  absl::Status check(void* stream, int peer) const {
    if (stream != nullptr) {
      return absl::InternalError(
          "a transport channel's call on a stream that is not the CPU's (a GPU's needs NCCL's)");
    }
    if (peer < 0 || peer >= t_->size() || peer == t_->rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a channel to rank ", peer, " from rank ", t_->rank(), " of ", t_->size()));
    }
    return absl::OkStatus();
  }
  // The sequence number of the next transfer with `peer` (then counted).
  std::uint64_t next(std::unordered_map<int, std::uint64_t>* counts, int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    return (*counts)[peer]++;
  }
  // Source, kind and 40 bits of sequence (a step's transfers are far fewer).
  Tag channel_tag(int source, std::uint64_t seq) const {
    return make_tag({.source = static_cast<std::uint32_t>(source),
                     .group = GroupKind::kChannel,
                     .kind = kind_,
                     .step = static_cast<std::uint32_t>(seq & 0xFFFF),
                     .micro = static_cast<std::uint32_t>((seq >> 16) & 0xFF),
                     .chunk = static_cast<std::uint32_t>((seq >> 24) & 0xF),
                     .layer = static_cast<std::uint32_t>((seq >> 28) & 0xFFF)});
  }
  // Posts the operation and waits for its completion here.
  template <class Post>
  absl::Status wait(Post post, const char* what, int peer) {
    auto done = std::make_shared<std::promise<absl::Status>>();
    std::future<absl::Status> result = done->get_future();
    post([done](absl::Status st) { done->set_value(std::move(st)); });
    absl::Status st = result.get();
    if (st.ok()) return st;
    return absl::UnavailableError(
        absl::StrCat("channel ", what, " with rank ", peer, ": ", st.message()));
  }

  Transport* t_;
  const MessageKind kind_;
  std::mutex mu_;  // the counts (a channel's calls may come from several streams)
  std::unordered_map<int, std::uint64_t> sent_, received_;
};

}  // namespace

std::unique_ptr<StreamPointToPoint> stream_channel(Transport* transport, MessageKind kind) {
  return std::make_unique<TransportChannel>(transport, kind);
}

}  // namespace troupe::comm
