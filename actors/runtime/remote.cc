// Control messages as frames: envelopes, the hello, the device check.
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

}  // namespace troupe::actors
