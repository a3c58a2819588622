// Every rank's events as one Chrome trace-event JSON file that Perfetto's
// UI (ui.perfetto.dev) and chrome://tracing open.
//
//   std::string json = trace::chrome_json(t, trace::match_messages(t));
//
// A process per rank ("rank r (d,s,t) host", sorted by rank), a thread per
// track: compute (forward, backward and, nested in them, TP collectives and
// their phases), shard (its waits and steps), optimizer stream, optimizer
// actor (its waits), sends, receives; messages in flight together go to
// lanes of their track ("sends (2)", ...), since a thread's slices nest. Closed events are "X"
// complete events; an open one runs to the end of the trace and its name ends in
// "(open)". A flow ("s" bound to the send, "f" bound to the receive) goes
// from each matched send to its receive. Times are microseconds from the
// trace's origin on the coordinator's clock; "otherData" has the clock
// uncertainty and the counts of matched and unmatched messages.
#pragma once

#include <string>
#include <vector>

#include "launcher/trace/files.h"
#include "launcher/trace/messages.h"

namespace troupe::launcher::trace {

// Perfetto's thread ids of a rank's tracks.
enum class Track { kCompute = 1, kShard, kOptimizerStream, kOptimizerActor, kSends, kReceives };
Track track_of(const Event& ev);
const char* track_name(Track t);

std::string chrome_json(const Trace& t, const std::vector<Message>& messages);

}  // namespace troupe::launcher::trace
