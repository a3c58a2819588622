// The analysis of a failed or stalled run's trace (the flight recorder's
// files), in the manner of PyTorch's flight-recorder analyzer (fr_trace):
// per rank its last completed compute op and what was still open; the
// messages posted on one side and never completed or never matched (who
// waits for whom); the TP collectives some ranks entered and others never
// did; and the likely stalled rank.
//
//   trace::FailureAnalysis a = trace::analyze_failure(t, trace::match_messages(t));
//   if (a.triggered) std::fputs(a.text.c_str(), stdout);
//
// The likely stalled ranks are found on a wait-for graph over ranks: rank r
// -> rank p for each of r's open receives, sends and waits naming peer p != r,
// and for each open TP collective r entered that peer p never entered. A
// rank that such edges point at and that has no edge out in the step they
// wait in (it never began the step, finished it, died, or waits only on
// itself, as its optimizer for its own shard's pieces) is where the waits
// end: the likely culprit. When every rank pointed at waits on another, the
// ranks of the cycle are named instead.
#pragma once

#include <string>
#include <vector>

#include "launcher/trace/files.h"
#include "launcher/trace/messages.h"

namespace troupe::launcher::trace {

struct FailureAnalysis {
  bool triggered = false;    // a header's reason is failure or stall, or some event is open
  std::vector<int> stalled;  // the likely stalled ranks (global), smallest first
  std::string text;          // "" when not triggered
};

FailureAnalysis analyze_failure(const Trace& t, const std::vector<Message>& ms);

}  // namespace troupe::launcher::trace
