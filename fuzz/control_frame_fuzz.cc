// Fuzzes the control channel's frame parser (comm/control_channel.h): the
// input is what a peer sent, after the job-token handshake.
//
// Checks: frames come off the front whole (kind 1-4, at most the maximum
// length, the buffer shorter by exactly header + body); a bad header or a
// length over the maximum is an error, never an allocation of the claimed
// size; an incomplete frame waits for more bytes.
#include <cstdint>
#include <string>

#include "comm/control_channel.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t kMax = 1 << 16;
  std::string buffer(reinterpret_cast<const char*>(data), size);
  for (;;) {
    const std::size_t before = buffer.size();
    auto frame = troupe::comm::take_control_frame(&buffer, kMax);
    if (!frame.ok()) {
      FUZZ_CHECK(buffer.size() == before);
      return 0;
    }
    if (!frame->has_value()) {
      FUZZ_CHECK(buffer.size() == before);
      return 0;
    }
    FUZZ_CHECK((*frame)->kind >= 1 && (*frame)->kind <= 4);
    FUZZ_CHECK((*frame)->body.size() <= kMax);
    FUZZ_CHECK(buffer.size() == before - 16 - (*frame)->body.size());
  }
}
