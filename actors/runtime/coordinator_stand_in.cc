#include "actors/runtime/coordinator_stand_in.h"

namespace troupe::actors {

CoordinatorStandIn::CoordinatorStandIn(caf::actor_config& cfg, FrameSink sink)
    : caf::event_based_actor(cfg), sink_(std::move(sink)) {
  set_default_handler(
      [this](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
        Envelope e{.to = Target::kCoordinator,
                   .actor = 0,
                   .request = 0,
                   .content = x.move_content_to_message()};
        (void)sink_(encode_envelope(home_system(), e));
        return caf::message{};
      });
}

caf::behavior CoordinatorStandIn::make_behavior() {
  // Everything goes through the default handler.
  return {[](remote_lost_atom, const std::string&) {}};
}

}  // namespace troupe::actors
