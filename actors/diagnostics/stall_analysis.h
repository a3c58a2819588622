// Hang diagnosis: from every actor's WaitReport, a table of who waits for
// what from whom, and the likely culprit, found on the wait-for graph.
//
// The stall watchdog (Coordinator, --stall-timeout) asks every shard and
// optimizer actor what it waits for; with no progress it ends the run with
// analyze_stall(...).text():
//
//   StallInput in;
//   in.reports = reports;  // every actor's answer
//   in.layout = layout;
//   in.step = 2;
//   in.hosts = {"h0", "h0", "h1", "h1"};  // by rank
//   StallAnalysis a = analyze_stall(in);
//   // a.table:     one aligned row per waiting actor and per shard that has
//   //              not begun the step
//   // a.culprits:  "likely culprit: rank 3 (d=1 s=1 t=0) on host h1: has not begun step 2"
//
// The graph is over ranks (a rank's shard and optimizer are one node): rank
// r -> rank p when one of r's actors waits for something p should send. The
// culprits are the ends of the waits: the strongly connected components
// that some waiter reaches and that have no edge out. A component of one
// rank is a rank that waits for no one else (it has not begun the step, did
// not answer, is waited on but waits for nothing, or waits on something no
// rank is known to send); a larger one is a wait-for cycle.
#pragma once

#include <string>
#include <vector>

#include "actors/messages.h"
#include "comm/groups.h"

namespace troupe::actors {

struct StallInput {
  // At most one report per actor, in any order. Every rank has a shard and
  // an optimizer actor; one with no report did not answer the question.
  std::vector<WaitReport> reports;
  comm::Layout layout;
  int step = 0;  // the step the coordinator is in (>= 1)
  // By rank: the shard reported ready for this step, so its step 0 means
  // "done", not "has not begun", and so does step + 1 for its shard and
  // optimizer (the next step, begun with this one's update). Empty: no
  // shard is ready.
  std::vector<bool> ready;
  // By rank; empty: unknown (no host column, no "on host").
  std::vector<std::string> hosts;
};

struct Culprit {
  std::vector<int> ranks;  // one rank, or a wait-for cycle in its order
  bool cycle = false;
  std::string text;  // "likely culprit: ..."
};

struct StallAnalysis {
  std::string table;              // "" when no actor waits
  std::vector<Culprit> culprits;  // by their smallest rank
  // The table and one line per culprit, each line indented by two spaces
  // and preceded by a newline; " (nothing reported)" when no actor waits.
  std::string text() const;
};

StallAnalysis analyze_stall(const StallInput& in);

}  // namespace troupe::actors
