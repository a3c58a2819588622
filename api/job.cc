// A job behind one handle: the JobActor takes the host's messages and
// tells subscribers the run's events; a thread of the job's own builds the
// run (actors::InProcessTrainer) and waits for it, so no scheduler thread
// of the host's system ever blocks.
#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "actors/runtime.h"
#include "api/train_flags.h"
#include "troupe/troupe.h"

namespace troupe {
namespace {

// From the job's thread to its actor.
using built_atom = caf::atom_constant<caf::atom("jobbuilt")>;
using coordinator_atom = caf::atom_constant<caf::atom("jobcoord")>;
using finished_atom = caf::atom_constant<caf::atom("jobfinish")>;

class JobActor : public caf::event_based_actor {
 public:
  JobActor(caf::actor_config& cfg, JobConfig config, caf::actor subscriber)
      : caf::event_based_actor(cfg), config_(std::move(config)) {
    status_.job = config_.name;
    status_.state = "starting";
    status_.steps = config_.options.steps;
    status_.tp = config_.parallel.tp;
    status_.pp = config_.parallel.pp;
    status_.dp = config_.parallel.dp;
    status_.layout = config_.parallel.layout().describe();
    if (subscriber) subscribe(subscriber);
    set_down_handler([this](caf::down_msg& dm) {
      subscribers_.erase(std::remove(subscribers_.begin(), subscribers_.end(), dm.source),
                         subscribers_.end());
    });
    // An exit message stops the job at its next step boundary; the handle
    // ends once the job has ended (its actors live in this system).
    set_exit_handler([this](caf::exit_msg& em) {
      exit_reason_ = em.reason;
      request_stop(0);
      if (ended_) quit(exit_reason_);
    });
  }

  caf::behavior make_behavior() override {
    start_thread();
    return {
        [this](subscribe_atom, const caf::actor& who) {
          subscribe(who);
          return status_;
        },
        [this](unsubscribe_atom, const caf::actor& who) {
          subscribers_.erase(std::remove(subscribers_.begin(), subscribers_.end(), who),
                             subscribers_.end());
        },
        [this](stop_atom) { request_stop(0); },
        [this](stop_atom, int step) { request_stop(step); },
        [this](save_now_atom) -> caf::result<void> {
          if (config_.checkpoint.save.empty()) {
            return caf::make_error(caf::sec::runtime_error,
                                   absl::StrCat(config_.name, ": save_now needs --save DIR"));
          }
          if (ended_) {
            return caf::make_error(caf::sec::runtime_error,
                                   absl::StrCat(config_.name, ": the run has ended"));
          }
          if (coordinator_) {
            send(coordinator_, save_now_atom::value);
          } else {
            save_pending_ = true;
          }
          return caf::unit;
        },
        [this](status_atom) { return status_; },
        // From the job's thread and the coordinator.
        [this](built_atom, const std::string& layout) {
          status_.layout = layout;
          status_.state = stop_after_ < std::numeric_limits<int>::max() ? "stopping" : "running";
        },
        [this](coordinator_atom, const caf::actor& coordinator) {
          coordinator_ = coordinator;
          if (stop_after_ < std::numeric_limits<int>::max()) {
            send(coordinator_, stop_atom::value, stop_after_);
          }
          if (save_pending_) send(coordinator_, save_now_atom::value);
        },
        [this](metrics_atom, const StepMetrics& m) {
          status_.step = m.step;
          status_.loss = m.loss;
          status_.tokens_per_s = m.tokens_per_s;
          tokens_ += m.tokens_per_s * m.step_s;
          seconds_ += m.step_s;
          status_.mean_tokens_per_s = seconds_ > 0 ? tokens_ / seconds_ : 0.0;
          tell(metrics_atom::value, m);
          if (m.val_loss) tell(validation_atom::value, m.step, *m.val_loss);
        },
        [this](log_atom, const std::string& line) { tell(log_atom::value, line); },
        [this](checkpoint_atom, int step, const std::string& dir) {
          tell(checkpoint_atom::value, step, dir);
        },
        [this](finished_atom, const std::string& error, bool stalled) {
          on_finished(error, stalled);
        },
    };
  }

  void on_exit() override {
    // Killed while the run goes on (an exit the handler cannot take): the
    // job is told to stop, and its thread finishes on its own.
    if (thread_.joinable()) {
      if (!ended_ && coordinator_) anon_send(coordinator_, stop_atom::value, 0);
      if (ended_) {
        thread_.join();
      } else {
        thread_.detach();
      }
    }
    subscribers_.clear();
    coordinator_ = nullptr;
  }

 private:
  void subscribe(const caf::actor& who) {
    if (!who || std::find(subscribers_.begin(), subscribers_.end(), who) != subscribers_.end()) {
      return;
    }
    subscribers_.push_back(who);
    monitor(who);
  }

  // 0: after the step in progress.
  void request_stop(int step) {
    if (ended_) return;
    stop_after_ = std::min(stop_after_, step);
    if (status_.state == "running") status_.state = "stopping";
    if (coordinator_) send(coordinator_, stop_atom::value, step);
  }

  void start_thread() {
    caf::actor self = caf::actor_cast<caf::actor>(this);
    caf::actor_system& system = home_system();
    JobConfig config = config_;
    thread_ = std::thread([self, &system, config = std::move(config)]() mutable {
      const absl::Status st = run_job(system, self, std::move(config));
      const bool stalled = absl::IsDeadlineExceeded(st);
      caf::anon_send(self, finished_atom::value, actors::status_text(st), stalled);
    });
  }

  // The run's callbacks hold the job weakly: the run's actors may outlive
  // it by a little, and must not keep it alive (nor be kept by it).
  static absl::Status run_job(caf::actor_system& system, const caf::actor& job, JobConfig config) {
    const caf::weak_actor_ptr self = caf::actor_cast<caf::weak_actor_ptr>(job);
    absl::StatusOr<std::optional<model::ckpt::Checkpoint>> loaded =
        api::open_load(config.checkpoint, config.options);
    if (!loaded.ok()) return loaded.status();
    if (!config.checkpoint.save.empty()) {
      if (absl::Status st = model::ckpt::lock_save_dir(config.checkpoint.save); !st.ok()) return st;
    }
    const model::ckpt::Checkpoint* load = loaded->has_value() ? &**loaded : nullptr;
    absl::StatusOr<std::unique_ptr<actors::InProcessTrainer>> t = actors::InProcessTrainer::create(
        config.options, config.parallel, config.stage_factory,
        {.flags = config.checkpoint,
         .loaded = load,
         .exit_requested = nullptr,
         .log = [self](const std::string& line) { tell_job(self, log_atom::value, line); },
         .on_checkpoint =
             [self](int step, const std::string& dir) {
               tell_job(self, checkpoint_atom::value, step, dir);
             }},
        config.trace);
    if (!t.ok()) return t.status();
    caf::anon_send(job, built_atom::value, (*t)->layout().describe());
    return (*t)->run(
        system, [self](const StepMetrics& m) { tell_job(self, metrics_atom::value, m); },
        [self](const caf::actor& coordinator) {
          tell_job(self, coordinator_atom::value, coordinator);
        });
  }

  template <class... Ts>
  static void tell_job(const caf::weak_actor_ptr& job, const Ts&... xs) {
    if (caf::actor a = caf::actor_cast<caf::actor>(job)) caf::anon_send(a, xs...);
  }

  void on_finished(const std::string& error, bool stalled) {
    ended_ = true;
    if (thread_.joinable()) thread_.join();  // (it has sent its last message)
    coordinator_ = nullptr;
    status_.state = error.empty() ? "ended" : "failed";
    status_.error = error;
    if (!error.empty()) {
      if (stalled) tell(stall_atom::value, error);
      tell(failure_atom::value, error);
    }
    send_ended();
    if (exit_reason_) quit(exit_reason_);
  }

  void send_ended() {
    for (const caf::actor& s : subscribers_) {
      send(s, ended_atom::value, config_.name, status_.step, status_.error);
    }
  }

  // Every event goes out with the job's name first.
  template <class Atom, class... Ts>
  void tell(Atom a, const Ts&... xs) {
    for (const caf::actor& s : subscribers_) send(s, a, config_.name, xs...);
  }

  JobConfig config_;
  JobStatus status_;
  std::vector<caf::actor> subscribers_;
  caf::actor coordinator_;
  int stop_after_ = std::numeric_limits<int>::max();
  bool save_pending_ = false;
  bool ended_ = false;
  caf::error exit_reason_;
  double tokens_ = 0, seconds_ = 0;
  std::thread thread_;
};

}  // namespace

void add_message_types(caf::actor_system_config& cfg) {
  actors::add_message_types(cfg);
  cfg.add_message_type<StepMetrics>("troupe::StepMetrics");
  cfg.add_message_type<JobStatus>("troupe::JobStatus");
}

absl::StatusOr<caf::actor> spawn_job(caf::actor_system& system, JobConfig config,
                                     const caf::actor& subscriber) {
  if (config.name.empty()) return absl::InvalidArgumentError("JobConfig.name is empty");
  if (config.options.global_batch == 0) config.options.global_batch = config.options.micro_batch;
  if (absl::Status st = config.options.validate(); !st.ok()) return st;
  if (absl::Status st = config.parallel.validate(config.options); !st.ok()) return st;
  if (absl::Status st = api::check_checkpoint_flags(config.checkpoint); !st.ok()) return st;
  if (config.checkpoint.exit_signal_handler) {
    return absl::InvalidArgumentError(
        "--exit-signal-handler is the command line's: send the job stop_atom instead");
  }
  return system.spawn<JobActor>(std::move(config), subscriber);
}

}  // namespace troupe
