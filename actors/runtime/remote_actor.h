// RemoteActor: an actor of a rank in another process, as a handle here
// (actors/runtime/remote.h: the frames it sends).
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <map>
#include <string>

#include "actors/runtime/remote.h"

namespace troupe::actors {

// Stands for actor `which` (kShard or kOptimizer) of a rank in another
// process. Its messages:
//   (remote_reply_atom, uint64 request, caf::message answer)  from the frame reader
//   (remote_lost_atom, std::string why)        the rank is gone: requests fail
// and anything else, which goes out as a frame. (It does not quit when the
// rank is lost: the host tells the coordinator who was lost and why, and
// stops the stand-ins when the run is over.)
class RemoteActor : public caf::event_based_actor {
 public:
  RemoteActor(caf::actor_config& cfg, Target which, FrameSink sink);
  caf::behavior make_behavior() override;

 private:
  caf::result<caf::message> forward(caf::message_view& x);
  void lost(const std::string& why);
  bool lost_ = false;

  Target which_;
  FrameSink sink_;
  std::uint64_t next_request_ = 1;
  std::map<std::uint64_t, caf::response_promise> pending_;
};

}  // namespace troupe::actors
