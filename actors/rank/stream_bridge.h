// Tells an actor when a stream's work is done, as a message to it.
//
// An actor enqueues ops on its stream and then, instead of waiting, asks for
// a message when they complete; the message arrives in its mailbox like any
// other, so the actor never blocks a CAF scheduler thread.
//
//   gpu::ops::matmul_forward(stream, ...);
//   actors::send_when_done(stream, self, caf::make_message(forward_done_atom::value, mb));
//   ...
//   [=](forward_done_atom, int mb) { /* stream.status() tells whether it worked */ }
#pragma once

#include <caf/all.hpp>

#include "gpu/device.h"

namespace troupe::actors {

// After all work enqueued on `stream` so far, sends `msg` to `target`
// (anonymously). Also sent when the stream has failed, so the receiver can
// read the error from stream.status().
void send_when_done(gpu::Stream& stream, caf::actor target, caf::message msg);

}  // namespace troupe::actors
