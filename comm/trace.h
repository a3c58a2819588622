// What a rank records about itself: compute ops, messages, collectives,
// optimizer work, waits and steps, as fixed-size events in a ring buffer.
//
// Every rank has one Recorder, always on: the flight recorder keeps the last
// few thousand events (written when a run fails or stalls); `--trace DIR`
// makes it large and writes it at the end. An event is recorded when it
// ends; one that has begun and not ended is "open" (a receive still posted,
// the op the stream is running, a wait) and is written as such, so a file
// written during a hang shows what each rank was in the middle of.
//
// Times are nanoseconds of the steady clock (CLOCK_MONOTONIC, shared by the
// processes of a host); a rank file's header carries the offset to the
// coordinator's clock (actors/diagnostics/trace_file.h).
//
// Thread safety: every method may be called from any thread (actors, the
// stream's thread, the transport's threads); one mutex, held for a copy of
// 64 bytes, which is cheap next to what an event marks (an op of
// milliseconds, a message).
//
//   comm::trace::Recorder rec(4096);
//   auto h = rec.open({.kind = Kind::kRecv, .step = 3, .peer = 1});
//   ...                                   // later, on another thread
//   rec.close(h);                         // now an event [open time, now]
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "comm/tag.h"

namespace troupe::comm::trace {

enum class Kind : std::uint8_t {
  kForward,  // a compute op: stream began .. finished it
  kBackward,
  kSend,  // a transport message: posted .. completed
  kRecv,
  kCollective,  // a collective on the compute stream (TP)
  kPhase,       // a part of a collective (reduce-scatter, all-gather, ...)
  kOptimizer,   // the optimizer's work on its stream (dp 1: the compute stream)
  kWait,        // an actor waiting for something
  kStep,        // a shard's step: begin_step .. ready
  kWeight,      // a compute op: a backward's weight gradients (W) alone
};

// What a wait is for, what an optimizer op or a collective phase is.
enum class What : std::uint8_t {
  kNone,
  // waits
  kActivation,
  kGradient,
  kSlot,
  kParams,
  kGradients,
  kClip,
  // optimizer ops
  kAdd,
  kNorm,
  kAdam,
  // collectives and their phases
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kDirect,
  kSharedMemory,
  kBroadcast,
  // steps
  kTrain,
  kEval,
};

struct Event {
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;  // 0 while open
  std::uint64_t tag = 0;    // messages: the transport tag
  std::int64_t bytes = 0;
  std::int32_t step = 0;
  std::int32_t micro = -1;  // optimizer adds: the contribution
  std::int32_t chunk = -1;
  std::int32_t layer =
      -1;                  // messages: the tag's layer field (bucket, wte flag); ops: virtual stage
  std::int32_t peer = -1;  // messages: the other rank; waits: whom for (-1: no one)
  std::int32_t seq = -1;   // collectives and phases: the rank's collective count
  Kind kind = Kind::kForward;
  What what = What::kNone;
  std::uint8_t actor = 0;   // waits: 0 shard, 1 optimizer, 2 the compute stream (at a gate)
  std::uint8_t failed = 0;  // messages: completed with an error
  std::uint8_t eval = 0;    // forwards of an evaluation
};

std::int64_t now_ns();
const char* kind_name(Kind k);
const char* what_name(What w);
// "activation", "gradient", "grad-piece", "param-piece", "tp", "collective", "control".
const char* message_name(Tag tag);

class Recorder {
 public:
  // Keeps the last `capacity` events (at least 1).
  explicit Recorder(std::size_t capacity);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Records only events of steps first..last (and those of step 0, which
  // belong to no step); the default records every step.
  void set_steps(int first, int last);
  bool wants(int step) const {
    return step == 0 || (step >= first_.load(std::memory_order_relaxed) &&
                         step <= last_.load(std::memory_order_relaxed));
  }

  // A finished event (end_ns set by the caller).
  void record(const Event& e);
  // An event that has begun now (or at e.begin_ns when set); close() ends
  // it now and records it. A handle is never reused while open; closing
  // kNone does nothing.
  using Handle = std::int64_t;
  static constexpr Handle kNone = -1;
  Handle open(Event e);
  void close(Handle h, bool failed = false);

  // Whether an event of `kind` has begun and not ended.
  bool has_open(Kind kind) const;

  struct Contents {
    std::vector<Event> events;   // the ring, oldest first
    std::vector<Event> open;     // begun, not ended (end_ns = 0)
    std::uint64_t recorded = 0;  // over the run
    std::uint64_t dropped = 0;   // overwritten by newer ones
    std::size_t capacity = 0;
  };
  Contents contents() const;

  std::size_t capacity() const { return ring_.size(); }
  int first_step() const { return first_.load(); }
  int last_step() const { return last_.load(); }

 private:
  void push(const Event& e);  // under mu_

  std::atomic<int> first_{0}, last_{1 << 30};
  mutable std::mutex mu_;
  std::vector<Event> ring_;
  std::uint64_t next_ = 0;  // events recorded; the next goes to next_ % size
  struct Slot {
    Event e;
    bool used = false;
  };
  std::vector<Slot> open_;    // open events, by handle
  std::vector<Handle> free_;  // unused slots of open_
};

}  // namespace troupe::comm::trace
