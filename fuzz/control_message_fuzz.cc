// Fuzzes the decoding of control messages (actors/runtime/remote.h): the input is a
// frame's body as a rank (or the coordinator) sent it, after the job-token
// handshake: an Envelope with one CAF-serialized message, or a rank's hello.
//
// Checks: nothing a frame says makes the decoder allocate what it claims
// (libFuzzer's -rss_limit_mb catches a 4 GiB vector from a 33-byte frame);
// only control messages' types decode; what decodes encodes back to a frame
// that decodes to the same message.
#include <caf/all.hpp>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "actors/runtime/remote.h"
#include "fuzz/fuzz_util.h"

namespace {

caf::actor_system& system_for_fuzzing() {
  static caf::actor_system_config* cfg = [] {
    auto* c = new caf::actor_system_config;
    troupe::actors::add_message_types(*c);
    c->set("scheduler.max-threads", 1);
    return c;
  }();
  static auto* sys = new caf::actor_system(*cfg);
  return *sys;
}

// With TROUPE_FUZZ_SEED_OUT=DIR, writes real frames there as seeds (the
// committed fuzz/corpus/control_message was made so).
void write_seeds(caf::actor_system& sys) {
  using namespace troupe::actors;
  const char* dir = std::getenv("TROUPE_FUZZ_SEED_OUT");
  if (dir == nullptr) return;
  auto put = [&](const std::string& name, char view, const std::string& frame) {
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << view << frame;
  };
  put("loss", 0,
      encode_envelope(sys, {.to = Target::kCoordinator,
                            .content = caf::make_message(loss_atom::value, 3, 1, 2, 1.5)}));
  put("world", 1,
      encode_envelope(sys, {.to = Target::kControl,
                            .content = caf::make_message(remote_world_atom::value,
                                                         std::vector<std::string>{"a", "bc"})}));
  WaitReport r;
  r.rank = 2;
  r.actor = "shard d=0 s=1";
  r.waiting = "the gradient from rank 3";
  put("reply", 0,
      encode_envelope(
          sys, {.to = Target::kReply, .actor = 0, .request = 7, .content = caf::make_message(r)}));
  put("hello", 0,
      encode_hello(sys, {.host = "h1",
                         .pid = 42,
                         .transport_address = "ucx",
                         .has_valid = true,
                         .train_data = "synthetic"}));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::actors;
  caf::actor_system& sys = system_for_fuzzing();
  static const bool seeded = (write_seeds(sys), true);
  (void)seeded;
  if (size == 0) return 0;
  const bool lists = (data[0] & 1) != 0;  // a rank's view (lists of strings) or the coordinator's
  const std::string frame(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto e = decode_envelope(sys, frame, lists);
  if (e.ok()) {
    const std::string again = encode_envelope(sys, *e);
    auto back = decode_envelope(sys, again, lists);
    FUZZ_CHECK(back.ok());
    FUZZ_CHECK(back->to == e->to && back->actor == e->actor && back->request == e->request);
    FUZZ_CHECK(caf::to_string(back->content) == caf::to_string(e->content));
  }
  auto h = decode_hello(sys, frame);
  if (h.ok()) {
    auto back = decode_hello(sys, encode_hello(sys, *h));
    FUZZ_CHECK(back.ok() && back->host == h->host &&
               back->transport_address == h->transport_address);
  }
  return 0;
}
