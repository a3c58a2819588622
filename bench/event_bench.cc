// The embedding API's event delivery (scripts/bench hop): a job in this
// program's own actor system, every op of it costing nothing
// (--debug-op-cost 0:0:0, one rank, one micro-batch a step), subscribed to
// by a scoped actor as docs/EMBEDDING.md's example does. Prints, for every
// step, when its metrics event reached the subscriber's handler, in
// nanoseconds of CLOCK_MONOTONIC (the trace's clock), one JSON line each;
// bench/hop_bench.py takes the rank's step end from the job's trace (--trace)
// and reports the difference: the rank's last message to the coordinator,
// then the coordinator's event to the subscriber.
//
// With --subscriber actor the subscriber is an event-based actor of the same
// system instead, as a host that reacts to events without a thread of its
// own would write it: no thread of the host's is woken for an event, which
// (sent with no execution unit, as every event is) puts the actor on the
// next CAF worker's queue in turn, busy, polling or asleep.
//
//   event_bench --trace DIR [--steps N] [--subscriber blocking|actor]
#include <time.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "troupe/troupe.h"

namespace {

std::int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe's embedding API: when each step's metrics event reaches a subscriber"};
  std::string trace;
  int steps = 300;
  app.add_option("--trace", trace, "The job's trace directory (the rank's step ends)")->required();
  app.add_option("--steps", steps)->check(CLI::Range(1, 100000));
  std::string op_cost = "0:0:0";
  app.add_option("--op-cost", op_cost, "--debug-op-cost of the job's ops (ms)")
      ->capture_default_str();
  std::string subscriber = "blocking";
  app.add_option("--subscriber", subscriber,
                 "blocking: a scoped actor in main's thread; actor: an event-based actor")
      ->check(CLI::IsMember({"blocking", "actor"}))
      ->capture_default_str();
  bool caf_defaults = false;
  app.add_flag("--caf-defaults", caf_defaults,
               "Leave CAF's scheduler as it comes (an idle worker polls every 50 us for 25 ms)");
  CLI11_PARSE(app, argc, argv);

  caf::actor_system_config cfg;
  if (caf_defaults) {
    troupe::add_message_types(cfg);
  } else {
    troupe::configure_actor_system(cfg);
  }
  caf::actor_system sys{cfg};
  absl::StatusOr<troupe::JobConfig> config =
      troupe::JobConfig::from_flags({"--model",
                                     "tiny",
                                     "--layers",
                                     "2",
                                     "--channels",
                                     "8",
                                     "--heads",
                                     "1",
                                     "--seq-len",
                                     "128",
                                     "--vocab-size",
                                     "16",
                                     "--make-vocab-size-divisible-by",
                                     "1",
                                     "--micro-batch-size",
                                     "1",
                                     "--global-batch-size",
                                     "1",
                                     "--debug-op-cost",
                                     op_cost,
                                     "--steps",
                                     std::to_string(steps),
                                     "--trace",
                                     trace});
  if (!config.ok()) {
    std::fprintf(stderr, "event_bench: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  caf::scoped_actor self{sys};
  std::vector<std::int64_t> received(static_cast<std::size_t>(steps) + 1, 0);
  auto on_metrics = [&received, steps](const troupe::StepMetrics& m) {
    const std::int64_t now = monotonic_ns();  // first: nothing else in the measure
    if (m.step >= 1 && m.step <= steps) received[static_cast<std::size_t>(m.step)] = now;
  };
  caf::actor target = self;
  if (subscriber == "actor") {
    // Records the events itself and hands main the job's end; main reads
    // `received` after that message (CAF's mailbox orders the two).
    target = sys.spawn([on_metrics, main = caf::actor(self)](caf::event_based_actor* a) {
      return caf::behavior{[on_metrics](troupe::metrics_atom, const std::string&,
                                        const troupe::StepMetrics& m) { on_metrics(m); },
                           [](troupe::log_atom, const std::string&, const std::string&) {},
                           [](troupe::stall_atom, const std::string&, const std::string&) {},
                           [a, main](troupe::failure_atom f, const std::string& name,
                                     const std::string& why) { a->send(main, f, name, why); },
                           [a, main](troupe::ended_atom e, const std::string& name, int code,
                                     const std::string& why) {
                             a->send(main, e, name, code, why);
                             a->quit();
                           }};
    });
  }
  absl::StatusOr<caf::actor> job = troupe::spawn_job(sys, *std::move(config), target);
  if (!job.ok()) {
    std::fprintf(stderr, "event_bench: %s\n", std::string(job.status().message()).c_str());
    return 1;
  }
  bool done = false;
  std::string error;
  self->receive_while([&] {
    return !done;
  })([&](troupe::metrics_atom, const std::string&, const troupe::StepMetrics& m) { on_metrics(m); },
     [&](troupe::log_atom, const std::string&, const std::string&) {},
     [&](troupe::stall_atom, const std::string&, const std::string&) {},
     [&](troupe::failure_atom, const std::string&, const std::string& why) { error = why; },
     [&](troupe::ended_atom, const std::string&, int, const std::string& why) {
       if (error.empty()) error = why;
       done = true;
     });
  if (!error.empty()) {
    std::fprintf(stderr, "event_bench: the job failed: %s\n", error.c_str());
    return 1;
  }
  for (int s = 1; s <= steps; s++) {
    std::printf("{\"step\": %d, \"received_ns\": %lld}\n", s,
                static_cast<long long>(received[static_cast<std::size_t>(s)]));
  }
  return 0;
}
