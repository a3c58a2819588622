// RequestRelay: the coordinator's requests to a worker's actors, asked
// there and answered as frames (actors/runtime/remote.h).
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <map>
#include <string>

#include "actors/runtime/remote.h"

namespace troupe::actors {

// Delivers the requests that arrive as frames in a worker process:
//   (remote_request_atom, uint8 target, uint64 request, caf::message) ->
// asks the local actor and sends its answer back as a kReply frame. The
// requests actors answer are the watchdog's (waiting_atom -> WaitReport).
class RequestRelay : public caf::event_based_actor {
 public:
  RequestRelay(caf::actor_config& cfg, caf::actor shard, caf::actor optimizer, FrameSink sink);
  caf::behavior make_behavior() override;

 private:
  caf::actor shard_, optimizer_;
  FrameSink sink_;
};

}  // namespace troupe::actors
