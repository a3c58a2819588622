// Stream completion as CAF messages.
#include "actors/rank/stream_bridge.h"

namespace troupe::actors {

void send_when_done(gpu::Stream& stream, caf::actor target, caf::message msg) {
  stream.host_callback([target = std::move(target), msg = std::move(msg)]() mutable {
    caf::anon_send(target, std::move(msg));
  });
}

}  // namespace troupe::actors
