// In-order point-to-point channels over a Transport, for streams whose
// device calls run on the stream's own thread (the CPU backend's, the
// opaque device's): comm::StreamPointToPoint as NCCL's behaves, for the
// tests of the device pipeline where no GPU is.
//
// Each call posts its transport operation and waits for it on the calling
// (stream) thread. The k-th send from this rank to a peer carries sequence
// number k in its tag and fills the peer's k-th receive from this rank, as
// NCCL's in-order channels would, whatever the two sides meant: a pair of
// ranks that disagree on the order gets each other's wrong messages, or a
// size mismatch, exactly where NCCL would.
//
//   auto ch = comm::stream_channel(&transport, comm::MessageKind::kActivation);
//   stream.device_call("send", {x}, [&](void* s) {
//     return ch->send_on(s, x.raw(), x.nbytes(), peer);
//   });
#pragma once

#include <memory>

#include "comm/collectives.h"
#include "comm/tag.h"
#include "comm/transport.h"

namespace troupe::comm {

// Peers are global ranks of `transport` (which must outlive the channel);
// `kind` keeps channels of different kinds between the same ranks apart. A
// failed transfer (the peer failed, Transport::fail_peer) is Unavailable.
// A call with a native stream (not the CPU's) is an error.
std::unique_ptr<StreamPointToPoint> stream_channel(Transport* transport, MessageKind kind);

}  // namespace troupe::comm
