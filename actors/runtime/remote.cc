// Control messages as frames: envelopes and the stand-in actors.
#include "actors/runtime/remote.h"

#include <bit>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "actors/messages.h"
#include "gpu/tensor.h"

namespace troupe::actors {

namespace {

// Every double and float of `m` as its bits (to_wire), and back (from_wire).
template <class From, class To, class Convert>
caf::message swap_floats(const caf::message& m, Convert convert) {
  bool any = false;
  for (std::size_t i = 0; i < m.size(); i++) any = any || m.match_element<From>(i);
  if (!any) return m;
  caf::message out;
  for (std::size_t i = 0; i < m.size(); i++) {
    out = caf::message::concat(out, m.match_element<From>(i)
                                        ? caf::make_message(convert(m.get_as<From>(i)))
                                        : m.slice(i, 1));
  }
  return out;
}

caf::message to_wire(const caf::message& m) {
  caf::message d = swap_floats<double, DoubleBits>(
      m, [](double x) { return DoubleBits{std::bit_cast<std::uint64_t>(x)}; });
  return swap_floats<float, FloatBits>(
      d, [](float x) { return FloatBits{std::bit_cast<std::uint32_t>(x)}; });
}

caf::message from_wire(const caf::message& m) {
  caf::message d = swap_floats<DoubleBits, double>(
      m, [](const DoubleBits& x) { return std::bit_cast<double>(x.bits); });
  return swap_floats<FloatBits, float>(
      d, [](const FloatBits& x) { return std::bit_cast<float>(x.bits); });
}

}  // namespace

std::string encode_envelope(caf::actor_system& system, const Envelope& e) {
  std::vector<char> buf;
  caf::binary_serializer sink{system, buf};
  auto to = static_cast<std::uint8_t>(e.to);
  std::uint8_t actor = e.actor;
  std::uint64_t request = e.request;
  caf::message content = to_wire(e.content);
  if (caf::error err = sink(to, actor, request, content)) {
    // Only a type nobody registered gets here: a programming error.
    throw gpu::InvariantError(
        absl::StrCat("cannot serialize a control message: ", system.render(err)));
  }
  return std::string(buf.data(), buf.size());
}

namespace {

// The message's type names ("@<>+@atom+@i32+..."), read without its values.
absl::Status check_types(caf::actor_system& system, absl::string_view frame,
                         bool allow_string_lists) {
  caf::binary_deserializer source{system, frame.data(), frame.size()};
  std::uint8_t to = 0, actor = 0;
  std::uint64_t request = 0;
  std::uint16_t nr = 0;
  std::string names;
  if (caf::error err = source(to, actor, request, nr)) {
    return absl::InvalidArgumentError("a control frame shorter than its header");
  }
  if (nr != 0 || source(names)) {
    return absl::InvalidArgumentError("a control frame whose message has no type list");
  }
  if (names == "@<>") return absl::OkStatus();
  if (!absl::StartsWith(names, "@<>+")) {
    return absl::InvalidArgumentError("a control frame whose message has no type list");
  }
  for (absl::string_view type : absl::StrSplit(names.substr(4), '+')) {
    // (double and float travel as their bits: troupe::f64 and f32)
    const bool scalar = type == "@atom" || type == "@i32" || type == "@i64" || type == "@u64" ||
                        type == "@u8" || type == "@str" || type == "bool" ||
                        type == "troupe::f64" || type == "troupe::f32" ||
                        type == "troupe::WaitReport";
    if (!scalar && !(allow_string_lists && type == "@strvec")) {
      return absl::InvalidArgumentError(absl::StrCat("a control frame with a value of type '",
                                                     type.substr(0, 64),
                                                     "', not a control message's"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Envelope> decode_envelope(caf::actor_system& system, absl::string_view frame,
                                         bool allow_string_lists) {
  if (absl::Status st = check_types(system, frame, allow_string_lists); !st.ok()) return st;
  caf::binary_deserializer source{system, frame.data(), frame.size()};
  std::uint8_t to = 0;
  Envelope e;
  if (caf::error err = source(to, e.actor, e.request, e.content)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a control frame that is not a message: ", system.render(err)));
  }
  if (source.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a control frame with ", source.remaining(), " bytes after its message"));
  }
  if (to > static_cast<std::uint8_t>(Target::kControl)) {
    return absl::InvalidArgumentError(absl::StrCat("a control frame for target ", to));
  }
  e.to = static_cast<Target>(to);
  e.content = from_wire(e.content);
  return e;
}

std::string encode_hello(caf::actor_system& system, const RankHello& h) {
  std::vector<char> buf;
  caf::binary_serializer sink{system, buf};
  RankHello x = h;
  if (caf::error err = sink(x.host, x.pid, x.transport_address, x.has_valid, x.train_data, x.device,
                            x.device_name)) {
    throw gpu::InvariantError(absl::StrCat("cannot serialize a hello: ", system.render(err)));
  }
  return std::string(buf.data(), buf.size());
}

absl::StatusOr<RankHello> decode_hello(caf::actor_system& system, absl::string_view bytes) {
  caf::binary_deserializer source{system, bytes.data(), bytes.size()};
  RankHello h;
  if (caf::error err = source(h.host, h.pid, h.transport_address, h.has_valid, h.train_data,
                              h.device, h.device_name);
      err || source.remaining() != 0) {
    return absl::InvalidArgumentError("a hello that is not a troupe rank's");
  }
  return h;
}

std::string device_kind(const gpu::Device& d) {
  if (d.kind() == gpu::DeviceKind::kCuda) return "cuda";
  return d.host_visible() ? "cpu" : "opaque";
}

absl::Status check_same_device(const std::vector<RankHello>& ranks) {
  for (std::size_t r = 1; r < ranks.size(); r++) {
    if (ranks[r].device == ranks[0].device) continue;
    auto on = [&](std::size_t i) {
      return absl::StrCat("rank ", i, " on host ", ranks[i].host, " computes on ",
                          ranks[i].device_name);
    };
    return absl::InvalidArgumentError(absl::StrCat(
        "the ranks' devices differ: ", on(0), ", ", on(r),
        " (a job's ranks compute on one kind of device: give every rank the same --device)"));
  }
  return absl::OkStatus();
}

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
