// Messages of a trace: each send paired with its receive, and the message
// log of `troupe trace DIR --messages`.
//
// The send on rank A with peer B and tag X is the receive on rank B with
// peer A and tag X; when (A, B, X) occurs several times they pair in order
// of post time (FIFO, as the transport matches them). A send or a receive
// with no partner stays unmatched: its other side was dropped from a ring,
// is outside a --trace-steps window, was never posted (a stall), or its
// rank wrote no file.
//
//   std::vector<trace::Message> ms = trace::match_messages(t);
//   for (const trace::Message& m : ms) if (!m.matched()) ...
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "launcher/trace/files.h"

namespace troupe::launcher::trace {

struct EventRef {
  int rank = -1;   // position in Trace::ranks (not the global rank)
  int index = -1;  // into that RankTrace::events
};

struct Message {
  int from = -1, to = -1;
  std::string tag;
  std::optional<EventRef> send, recv;
  bool matched() const { return send.has_value() && recv.has_value(); }
};

const Event& event_of(const Trace& t, EventRef ref);

// Every send and receive, paired; matched ones in the order of their send's
// post time, then unmatched sends, then unmatched receives.
std::vector<Message> match_messages(const Trace& t);

// The message that carried a compute op's input: the matched, completed
// activation (for a forward) or gradient (for a backward) of its step and
// micro-batch into its rank that arrived last by the op's begin (+ slack:
// the recorder stamps an arrival after the callback that reports it, so an
// op may seem to begin a little before its input arrived).
class InputIndex {
 public:
  static constexpr std::int64_t kSlackNs = 50'000;

  InputIndex(const Trace& t, const std::vector<Message>& ms);
  // rank_index: the op's rank's position in Trace::ranks; nullptr if none.
  const Message* input_of(int rank_index, const Event& op) const;
  const Trace& trace() const { return t_; }

 private:
  using Key = std::tuple<int, bool, int, int>;  // (rank index, gradient?, step, mb)
  const Trace& t_;
  std::map<Key, std::vector<const Message*>> by_key_;
};

struct MessageFilter {
  std::optional<int> rank;  // either end
  std::optional<int> micro_batch;
  std::optional<std::string> kind;  // activation | gradient | tp | grad-piece | ...
};

// One line per message in time order (its send's post, or its only side's
// begin): time in ms from the trace's origin, from -> to, kind, step,
// micro-batch, bytes, latency (receive completion - send post); then the
// unmatched ones say which side is missing.
std::string message_log(const Trace& t, const std::vector<Message>& ms, const MessageFilter& f);

}  // namespace troupe::launcher::trace
