// CoordinatorStandIn: the coordinator, as a handle in a worker process
// (actors/runtime/remote.h: the frames it sends).
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <map>
#include <string>

#include "actors/runtime/remote.h"

namespace troupe::actors {

// Stands for the coordinator in a worker process: everything it is sent
// goes out as a frame to the coordinator (a failed send is dropped: the
// lost connection ends the worker by itself).
class CoordinatorStandIn : public caf::event_based_actor {
 public:
  CoordinatorStandIn(caf::actor_config& cfg, FrameSink sink);
  caf::behavior make_behavior() override;

 private:
  FrameSink sink_;
};

}  // namespace troupe::actors
