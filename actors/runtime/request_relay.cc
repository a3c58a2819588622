#include "actors/runtime/request_relay.h"

#include <chrono>

#include "actors/messages.h"

namespace troupe::actors {

RequestRelay::RequestRelay(caf::actor_config& cfg, caf::actor shard, caf::actor optimizer,
                           FrameSink sink)
    : caf::event_based_actor(cfg),
      shard_(std::move(shard)),
      optimizer_(std::move(optimizer)),
      sink_(std::move(sink)) {}

caf::behavior RequestRelay::make_behavior() {
  return {
      [this](remote_request_atom, std::uint8_t target, std::uint64_t id, caf::message& content) {
        const caf::actor& dest =
            target == static_cast<std::uint8_t>(Target::kShard) ? shard_ : optimizer_;
        request(dest, std::chrono::seconds(30), std::move(content))
            .then(
                [this, target, id](const WaitReport& r) {
                  (void)sink_(encode_envelope(home_system(), {.to = Target::kReply,
                                                              .actor = target,
                                                              .request = id,
                                                              .content = caf::make_message(r)}));
                },
                [](caf::error&) {});  // the asker's own timeout says it
      },
  };
}

}  // namespace troupe::actors
