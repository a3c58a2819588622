// troupe's public API: train a GPT inside your own program. A job is the
// actors `troupe train` runs (a shard and an optimizer partition per rank,
// and a coordinator), spawned in your caf::actor_system, behind one handle
// you talk to with the typed messages below. `troupe watch`'s connection to
// a running `troupe launch` job is here too (JobWatcher).
//
//   caf::actor_system_config cfg;
//   troupe::configure_actor_system(cfg);       // before the system starts
//   caf::actor_system sys{cfg};
//   absl::StatusOr<troupe::JobConfig> config =
//       troupe::JobConfig::from_flags({"--model", "tiny", "--pp", "2", "--dp", "2", "--steps",
//       "50"});
//   caf::scoped_actor self{sys};
//   absl::StatusOr<caf::actor> job = troupe::spawn_job(sys, *config, self);  // self subscribes
//   bool done = false;
//   self->receive_while([&] { return !done; })(
//       [&](troupe::metrics_atom, const std::string&, const troupe::StepMetrics& m) {
//         if (m.loss < 5.0) self->send(*job, troupe::stop_atom::value);  // after the step in
//         progress (the next: it began with this one's update)
//       },
//       [&](troupe::ended_atom, const std::string&, int steps, const std::string& error) {
//         done = true;
//       });  // (a blocking actor leaves the events it does not match in its mailbox)
//
// Messages to a job's handle (sent with request(), subscribe and status
// answer, save_now answers an error without --save; a plain send gets no
// reply, and a refused save_now is a log_atom event):
//   (subscribe_atom, caf::actor who) -> JobStatus   who gets the events below from now on
//   (unsubscribe_atom, caf::actor who)
//   (stop_atom)                   end after the step in progress (at a step boundary; a
//                                 step whose update has begun the next is no longer in
//                                 progress: then after the next)
//   (stop_atom, int step)         end after `step` (or the step in progress, if later)
//   (save_now_atom)               a checkpoint after the step in progress (needs --save)
//   (status_atom) -> JobStatus    step, layout, throughput, state
// Events to subscribers, each with the job's name first:
//   (metrics_atom, std::string job, StepMetrics m)         after every step
//   (validation_atom, std::string job, int step, double loss)   after an evaluation
//   (checkpoint_atom, std::string job, int step, std::string dir)  a checkpoint is committed
//   (log_atom, std::string job, std::string line)          a line for the user (saves, stops)
//   (stall_atom, std::string job, std::string report)      no progress: who waits for whom
//   (failure_atom, std::string job, std::string error)     the run failed (then ended_atom)
//   (ended_atom, std::string job, int steps_done, std::string error)   last; error "" if OK
//
// Threading: the job's model and data are built, and its run waited for,
// on a thread of its own, which keeps the system up until it ends; the job's
// actors are event-based and never wait for a run or for a host. (They do
// the run's own work on the system's threads: the coordinator commits a
// checkpoint -- fsync, rename -- as in `troupe train`.) A subscriber's
// handlers run like any actor's. The system's destructor waits for every
// job: stop them first (an exit message to the handle stops its job at the
// next step boundary and ends the handle when the job has ended).
// docs/EMBEDDING.md has the details.
#pragma once

#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/messages.h"
#include "actors/rank/rank.h"
#include "model/trainer.h"

namespace troupe {

using model::StepMetrics;

// What a job runs: `troupe train`'s options, filled in code or parsed from
// its flags.
struct JobConfig {
  std::string name = "job";              // names the job in its events
  model::TrainOptions options;           // model, data, batch, schedule, steps (model/trainer.h)
  actors::ParallelOptions parallel;      // tp, pp, dp, schedule, stall timeout (actors/rank/rank.h)
  actors::CheckpointOptions checkpoint;  // --save, --save-interval, --load, ...
  actors::TraceOptions trace;            // --trace, --flight-dir
  actors::StageFactory stage_factory;    // nullptr: GPT stages (tests may time fake ones)
  // The device parallel.device points at when from_flags made one (--device
  // cuda or opaque; null for the CPU, the process's own). A host that sets
  // parallel.device itself keeps that device alive for the job's life.
  std::shared_ptr<gpu::Device> device;

  // `troupe train`'s flags (without the program's and the command's names),
  // resolved as `troupe train` resolves them (presets, --recipe, defaults).
  // InvalidArgument naming the flag; the command line's own flags
  // (--print-config, --metrics-jsonl, --save-weights, --log-interval,
  // --exit-signal-handler) are refused: a host subscribes to the job.
  static absl::StatusOr<JobConfig> from_flags(const std::vector<std::string>& args);
};

// The job's state as a status request answers it.
struct JobStatus {
  std::string job;
  std::string state;  // "starting", "running", "stopping", "ended", "failed"
  int step = 0;       // steps completed (a resumed run counts from its checkpoint)
  int steps = 0;      // the run's length
  int tp = 1, pp = 1, dp = 1;
  std::string layout;            // "tp=1 pp=2 dp=2 (4 ranks)"
  double loss = 0;               // the last step's
  double tokens_per_s = 0;       // the last step's
  double mean_tokens_per_s = 0;  // over the steps so far
  std::string error;             // why it failed ("" otherwise)
};

// (The atoms' values are prefixed "trp_": CAF atoms are global values,
// and a host's own `stop` must not match a job's.)
using subscribe_atom = caf::atom_constant<caf::atom("trp_subscr")>;
using unsubscribe_atom = caf::atom_constant<caf::atom("trp_unsub")>;
using stop_atom = actors::stop_atom;          // "trp_stop"
using save_now_atom = actors::save_now_atom;  // "trp_save"
using status_atom = caf::atom_constant<caf::atom("trp_status")>;
using metrics_atom = caf::atom_constant<caf::atom("trp_metric")>;
using validation_atom = caf::atom_constant<caf::atom("trp_valid")>;
using checkpoint_atom = caf::atom_constant<caf::atom("trp_ckpt")>;
using log_atom = caf::atom_constant<caf::atom("trp_log")>;
using stall_atom = caf::atom_constant<caf::atom("trp_stall")>;
using failure_atom = caf::atom_constant<caf::atom("trp_fail")>;
using ended_atom = caf::atom_constant<caf::atom("trp_ended")>;

// Registers every message type of troupe's actors and of this API with
// `cfg`; call it before the actor system is made from it.
void add_message_types(caf::actor_system_config& cfg);

// add_message_types, and CAF's scheduler as troupe's own programs set it: a
// worker with nothing to do goes from its short busy poll straight to
// sleeping on a condition variable that a new message wakes, instead of
// waking every 50 us for 25 ms to look (CAF's default). A job's actors run
// on the host's workers, so with the default each hop of the job's messages
// that found the worker napping waited up to 50 us, and the naps took a
// share of the cores. And two workers, as `troupe train` runs (CAF's
// default is at least four; a message sent with no execution unit, as
// anon_send sends the job's own messages and its events, goes to the next
// worker in turn and wakes it, so more workers meant more of them woken:
// `scripts/bench hop`'s api_event). Fewer workers than the default also
// means fewer for the host's own actors: a host that needs more, or whose
// handlers block, sets its own number. Each setting is made only where
// `cfg` has none yet: a setting the host made before this call, or makes
// after it, wins.
void configure_actor_system(caf::actor_system_config& cfg);

// Checks `config` (InvalidArgument naming the option), then spawns the job
// in `system` and returns its handle; the job starts at once. `subscriber`
// (if any) is subscribed before the first step. Building the model and
// reading the data happen on the job's own thread: an error there (a
// missing --data-path file) comes as failure_atom and ended_atom.
absl::StatusOr<caf::actor> spawn_job(caf::actor_system& system, JobConfig config,
                                     const caf::actor& subscriber = caf::actor());

// A connection to a running `troupe launch` job's coordinator (what
// `troupe watch` uses): it proves the job token, then delivers the job's
// events to `subscriber` as the messages above (metrics_atom, log_atom for
// its progress and warnings, checkpoint_atom, stall_atom, failure_atom,
// ended_atom), with Options::name as the job's name. The feed is
// read-only: a watcher cannot stop the job, and its leaving or dying never
// disturbs it; several may watch at once. Refused (PermissionDenied)
// without the job's token -- which is the job's whole credential (a rank
// proves the same one): give it only to whom you would let join the job.
class JobWatcher {
 public:
  struct Options {
    std::string host;
    int port = 0;
    std::string token;
    double connect_timeout_s = 5;
    std::string name = "launch";  // the job's name in the events
  };
  // What the job said when the watcher joined: its length and layout.
  struct Hello {
    int steps = 0;
    int step = 0;  // steps done when the watcher joined
    std::string layout;
    std::string model;
  };
  static absl::StatusOr<std::unique_ptr<JobWatcher>> attach(const Options& options,
                                                            const caf::actor& subscriber);
  ~JobWatcher();  // leaves (the job goes on)
  const Hello& hello() const { return hello_; }

 private:
  JobWatcher() = default;
  struct Link;
  std::unique_ptr<Link> link_;
  Hello hello_;
};

// CAF's inspection of the messages' types.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobStatus& x) {
  return f(caf::meta::type_name("troupe::JobStatus"), x.job, x.state, x.step, x.steps, x.tp, x.pp,
           x.dp, x.layout, x.loss, x.tokens_per_s, x.mean_tokens_per_s, x.error);
}

}  // namespace troupe

namespace troupe::model {
// (val_loss travels as a flag and a value: CAF 0.17 has no std::optional.)
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepMetrics& x) {
  bool has_val = x.val_loss.has_value();
  double val = x.val_loss.value_or(0.0);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x.val_loss = has_val ? std::optional<double>(val) : std::nullopt;
    return caf::none;
  });
  return f(caf::meta::type_name("troupe::StepMetrics"), x.step, x.global_batch, x.consumed_samples,
           x.loss, x.grad_norm, x.loss_scale, x.skipped, x.skipped_steps, x.lr, x.step_s,
           x.tokens_per_s, has_val, val, load);
}
}  // namespace troupe::model
