#include "actors/runtime/remote_actor.h"

namespace troupe::actors {

RemoteActor::RemoteActor(caf::actor_config& cfg, Target which, FrameSink sink)
    : caf::event_based_actor(cfg), which_(which), sink_(std::move(sink)) {
  set_default_handler([this](caf::scheduled_actor*, caf::message_view& x) { return forward(x); });
}

caf::behavior RemoteActor::make_behavior() {
  return {
      [this](remote_reply_atom, std::uint64_t request, caf::message& answer) {
        auto it = pending_.find(request);
        if (it == pending_.end()) return;  // answered late, after the rank was lost
        it->second.deliver(std::move(answer));
        pending_.erase(it);
      },
      [this](remote_lost_atom, const std::string& why) { lost(why); },
  };
}

caf::result<caf::message> RemoteActor::forward(caf::message_view& x) {
  const bool is_request = current_mailbox_element()->mid.is_request();
  Envelope e{.to = which_, .actor = 0, .request = 0, .content = x.move_content_to_message()};
  if (!is_request) {
    if (!lost_) (void)sink_(encode_envelope(home_system(), e));
    return caf::message{};
  }
  caf::response_promise rp = make_response_promise();
  if (lost_) {
    rp.deliver(caf::make_error(caf::sec::request_receiver_down));
    return rp;
  }
  e.request = next_request_++;
  if (absl::Status st = sink_(encode_envelope(home_system(), e)); !st.ok()) {
    rp.deliver(caf::make_error(caf::sec::request_receiver_down));
    return rp;
  }
  pending_.emplace(e.request, rp);
  return rp;
}

void RemoteActor::lost(const std::string& why) {
  (void)why;  // the coordinator hears it from the host, by name
  lost_ = true;
  for (auto& [id, rp] : pending_) rp.deliver(caf::make_error(caf::sec::request_receiver_down));
  pending_.clear();
}

}  // namespace troupe::actors
