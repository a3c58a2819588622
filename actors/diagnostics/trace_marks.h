// How the actors mark their work in their rank's Recorder (comm/trace.h).
//
// Stream work is marked from the stream itself: a host callback before the
// work opens the event and one after it closes it, so the times are when
// the stream ran it, not when it was enqueued (what a CUDA event pair would
// measure on a GPU). Between the two, `current` says which op the compute
// stream is in, so the TP collectives it runs (host callbacks of the same
// stream) are marked with that op's step and micro-batch.
//
//   actors::mark_stream(trace, stream, {.kind = Kind::kForward, .step = 3, .micro = 1},
//                       [&] { stage.forward(stream, slot, tokens, targets); });
#pragma once

#include <atomic>
#include <functional>

#include "comm/trace.h"
#include "gpu/device.h"

namespace troupe::actors {

struct RankTrace {
  comm::trace::Recorder* recorder = nullptr;
  // The step the rank's shard is in (set at begin_step; any thread reads
  // it): the full step of messages whose tags carry it mod 2^16 or not at
  // all (a TP collective's). Owned by the RankUnit, read by its
  // TracedTransport.
  std::atomic<int>* step = nullptr;
  // The compute stream's op (written and read on that stream's thread only).
  comm::trace::Event current;
  int collective_seq = 0;  // TP collectives issued, on the compute stream's thread
};

// Marks what `enqueue` puts on `stream` as one event `e` (e.begin_ns and
// e.end_ns are set by the stream). With `set_current`, `trace->current` is
// `e` while it runs (also outside the recorder's step window: the
// collectives inside are then left out as theirs). Does only `enqueue()`
// when `trace` or its recorder is null.
void mark_stream(RankTrace* trace, gpu::Stream& stream, const comm::trace::Event& e,
                 const std::function<void()>& enqueue, bool set_current = false);

}  // namespace troupe::actors
