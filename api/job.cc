// A job behind one handle: the JobActor takes the host's messages and
// tells subscribers the run's events; a thread of the job's own builds the
// run (actors::InProcessTrainer) and waits for it, so no scheduler thread
// of the host's system waits for a run.
//
// Lifetimes: the thread holds a scoped actor of the host's system until its
// very end, so the system's destructor waits for the thread, whatever
// happened to the handle. The thread and the actor share a Control: a
// killed handle stops the run through it (the coordinator asks it at every
// step boundary, and at an update that could begin the next step), and the
// stop a host asked for before the coordinator
// existed reaches the coordinator before its first step.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actors/diagnostics/trace_file.h"
#include "actors/runtime/in_process.h"
#include "api/train_flags.h"
#include "troupe/troupe.h"

namespace troupe {
namespace {

// From the job's thread and its run to its actor; each carries the job's
// key, so only they are taken (anyone may send the handle anything).
using built_atom = caf::atom_constant<caf::atom("trp_jbuilt")>;
using coordinator_atom = caf::atom_constant<caf::atom("trp_jcoord")>;
using finished_atom = caf::atom_constant<caf::atom("trp_jend")>;
using step_relay_atom = caf::atom_constant<caf::atom("trp_jstep")>;

constexpr int kNoStop = std::numeric_limits<int>::max();

struct Control {
  std::atomic<int> stop_after{kNoStop};  // what the host asked for (0: the step in progress)
  std::atomic<bool> killed{false};       // the handle is gone: stop at the next boundary
};

// --save directories of live jobs in this process: two jobs never share one
// (the directory's lock is the process's, so it cannot tell them apart).
std::mutex save_dirs_mu;
std::map<std::string, std::string> save_dirs;  // directory -> the job saving there

std::string save_key(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(dir, ec);
  return ec ? dir : p.string();
}

absl::Status claim_save_dir(const std::string& dir, const std::string& job) {
  if (dir.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(save_dirs_mu);
  const auto [it, added] = save_dirs.emplace(save_key(dir), job);
  if (!added) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--save ", dir, ": another job of this process saves there (job ", it->second, ")"));
  }
  return absl::OkStatus();
}

void release_save_dir(const std::string& dir) {
  if (dir.empty()) return;
  std::lock_guard<std::mutex> lock(save_dirs_mu);
  save_dirs.erase(save_key(dir));
}

// Who hears a job's events: the handle's subscribers, whom the run's
// callbacks also tell straight from the coordinator's thread (a step's
// metrics, log lines, checkpoints), one hand-off less than through the
// handle (`scripts/bench hop`'s api_event). Events go in the order they are
// told: one lock for the list and the sends.
struct Audience {
  explicit Audience(std::string name) : job(std::move(name)) {}
  template <class Atom, class... Ts>
  void tell(Atom a, const Ts&... xs) {
    std::lock_guard<std::mutex> lock(mu);
    for (const caf::actor& s : subscribers) caf::anon_send(s, a, job, xs...);
  }
  bool add(const caf::actor& who) {
    std::lock_guard<std::mutex> lock(mu);
    if (!who || std::find(subscribers.begin(), subscribers.end(), who) != subscribers.end()) {
      return false;
    }
    subscribers.push_back(who);
    return true;
  }
  void remove(const caf::actor_addr& who) {
    std::lock_guard<std::mutex> lock(mu);
    subscribers.erase(std::remove(subscribers.begin(), subscribers.end(), who), subscribers.end());
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu);
    subscribers.clear();
  }

  const std::string job;
  std::mutex mu;
  std::vector<caf::actor> subscribers;
};

class JobActor : public caf::event_based_actor {
 public:
  JobActor(caf::actor_config& cfg, JobConfig config, caf::actor subscriber)
      : caf::event_based_actor(cfg), config_(std::move(config)) {
    std::random_device rd;
    key_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    status_.job = config_.name;
    status_.state = "starting";
    status_.steps = config_.options.steps;
    status_.tp = config_.parallel.tp;
    status_.pp = config_.parallel.pp;
    status_.dp = config_.parallel.dp;
    status_.layout = config_.parallel.layout().describe();
    if (subscriber) subscribe(subscriber);
    set_down_handler([this](caf::down_msg& dm) { audience_->remove(dm.source); });
    // An exit message (other than normal, which CAF ignores too) stops the
    // job at its next step boundary; the handle ends once the job has.
    set_exit_handler([this](caf::exit_msg& em) {
      if (em.reason == caf::exit_reason::normal) return;
      exit_reason_ = em.reason;
      exiting_ = true;
      request_stop(0);
      if (ended_) quit(exit_reason_);
    });
    // Nothing a host sends may end the handle: stray errors and messages
    // it does not know are dropped.
    set_error_handler([](caf::error&) {});
    set_default_handler(caf::drop);
  }

  caf::behavior make_behavior() override {
    start_thread();
    return {
        [this](subscribe_atom, const caf::actor& who) {
          subscribe(who);
          answer(status_);
        },
        [this](unsubscribe_atom, const caf::actor& who) { audience_->remove(who.address()); },
        [this](stop_atom) { request_stop(0); },
        [this](stop_atom, int step) { request_stop(std::max(step, 0)); },
        [this](save_now_atom) { save_now(); },
        [this](status_atom) { answer(status_); },
        // From the job's thread and its run (with the key).
        [this](built_atom, std::uint64_t key, const std::string& layout) {
          if (key != key_) return;
          status_.layout = layout;
          status_.state = control_->stop_after.load() < kNoStop ? "stopping" : "running";
        },
        [this](coordinator_atom, std::uint64_t key, const caf::actor& coordinator) {
          if (key != key_ || ended_) return;
          coordinator_ = coordinator;
          // (The thread sent the stop known when the run began; one asked
          // for since goes now.)
          if (const int s = control_->stop_after.load(); s < kNoStop) {
            send(coordinator_, stop_atom::value, s);
          }
          if (save_pending_) send(coordinator_, save_now_atom::value);
          save_pending_ = false;
        },
        [this](step_relay_atom, std::uint64_t key, const StepMetrics& m) {
          if (key != key_) return;
          status_.step = m.step;
          status_.loss = m.loss;
          status_.tokens_per_s = m.tokens_per_s;
          tokens_ += m.tokens_per_s * m.step_s;
          seconds_ += m.step_s;
          status_.mean_tokens_per_s = seconds_ > 0 ? tokens_ / seconds_ : 0.0;
          // (The subscribers heard of the step from the run itself.)
        },
        [this](finished_atom, std::uint64_t key, const std::string& error, bool stalled) {
          if (key == key_) on_finished(error, stalled);
        },
    };
  }

  void on_exit() override {
    // Killed while the run goes on (an exit the handler cannot take): the
    // run stops at its next step boundary, and the thread, which keeps the
    // system up until its end, finishes on its own.
    control_->killed = true;
    if (thread_.joinable()) {
      if (ended_) {
        thread_.join();
      } else {
        thread_.detach();
      }
    }
    audience_->clear();
    coordinator_ = nullptr;
  }

 private:
  // A reply to a request (a plain send gets none: a reply it did not ask
  // for would reach the sender as an unexpected message).
  template <class T>
  void answer(T x) {
    if (current_mailbox_element()->mid.is_request()) {
      make_response_promise<T>().deliver(std::move(x));
    }
  }

  void save_now() {
    std::string refused;
    if (config_.checkpoint.save.empty()) refused = "save_now needs --save DIR";
    if (ended_) refused = "the run has ended";
    if (!refused.empty()) {
      refused = absl::StrCat(config_.name, ": ", refused);
      if (current_mailbox_element()->mid.is_request()) {
        make_response_promise<void>().deliver(caf::make_error(caf::sec::runtime_error, refused));
      } else {
        tell(log_atom::value, absl::StrCat("not saved: ", refused));
      }
      return;
    }
    if (coordinator_) {
      send(coordinator_, save_now_atom::value);
    } else {
      save_pending_ = true;
    }
  }

  void subscribe(const caf::actor& who) {
    if (audience_->add(who)) monitor(who);
  }

  // 0: after the step in progress.
  void request_stop(int step) {
    if (ended_) return;
    int now = control_->stop_after.load();
    while (step < now && !control_->stop_after.compare_exchange_weak(now, step)) {
    }
    if (status_.state == "running") status_.state = "stopping";
    if (coordinator_) send(coordinator_, stop_atom::value, step);
  }

  void start_thread() {
    // Keeps the system up (its destructor waits for every actor that is
    // not hidden) until the thread's very end.
    auto keep = std::make_unique<caf::scoped_actor>(home_system());
    thread_ = std::thread([keep = std::move(keep), job = caf::actor_cast<caf::actor>(this),
                           system = &home_system(), config = config_, control = control_,
                           audience = audience_, key = key_]() mutable {
      {
        caf::actor self = std::move(job);
        JobConfig c = std::move(config);
        const std::string save = c.checkpoint.save;
        const absl::Status st = run_job(*system, self, key, std::move(c), control, audience);
        release_save_dir(save);
        caf::anon_send(
            self, finished_atom::value, key, actors::status_text(st),
            absl::IsDeadlineExceeded(st) && absl::StrContains(st.message(), "no progress"));
        control.reset();
      }
      keep.reset();  // last: the system may end once this is gone
    });
  }

  // The run's callbacks hold the job weakly: the run's actors may outlive
  // it by a little, and must not keep it alive (nor be kept by it).
  static absl::Status run_job(caf::actor_system& system, const caf::actor& job, std::uint64_t key,
                              JobConfig config, const std::shared_ptr<Control>& control,
                              const std::shared_ptr<Audience>& audience) {
    const caf::weak_actor_ptr self = caf::actor_cast<caf::weak_actor_ptr>(job);
    auto stopped = [&] { return absl::CancelledError("the job's handle was killed"); };
    if (control->killed) return stopped();
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
         .exit_requested = [control] { return control->killed.load(); },
         .log = [audience](const std::string& line) { audience->tell(log_atom::value, line); },
         .on_checkpoint =
             [audience](int step, const std::string& dir) {
               audience->tell(checkpoint_atom::value, step, dir);
             }},
        config.trace);
    if (!t.ok()) return t.status();
    if (control->killed) return stopped();
    caf::anon_send(job, built_atom::value, key, (*t)->layout().describe());
    return (*t)->run(
        system,
        [self, key, audience](const StepMetrics& m) {
          // The handle's status first: a status request a subscriber makes
          // on this event is behind it in the handle's mailbox.
          tell_job(self, step_relay_atom::value, key, m);
          audience->tell(metrics_atom::value, m);
          if (m.val_loss) audience->tell(validation_atom::value, m.step, *m.val_loss);
        },
        [self, key, control](const caf::actor& coordinator) {
          // (Before the run's start message, from this thread: a stop the
          // host asked for already is in the coordinator's mailbox first.)
          if (const int s = control->stop_after.load(); s < kNoStop) {
            caf::anon_send(coordinator, stop_atom::value, s);
          }
          tell_job(self, coordinator_atom::value, key, coordinator);
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
    tell(ended_atom::value, status_.step, status_.error);
    if (exiting_) quit(exit_reason_);
  }

  // Every event goes out with the job's name first.
  template <class Atom, class... Ts>
  void tell(Atom a, const Ts&... xs) {
    audience_->tell(a, xs...);
  }

  JobConfig config_;
  std::uint64_t key_ = 0;
  std::shared_ptr<Control> control_ = std::make_shared<Control>();
  JobStatus status_;
  std::shared_ptr<Audience> audience_ = std::make_shared<Audience>(config_.name);
  caf::actor coordinator_;
  bool save_pending_ = false;
  bool ended_ = false;
  bool exiting_ = false;
  caf::error exit_reason_;
  double tokens_ = 0, seconds_ = 0;
  std::thread thread_;
};

void add_api_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<StepMetrics>("troupe::StepMetrics");
  cfg.add_message_type<JobStatus>("troupe::JobStatus");
}

}  // namespace

void add_message_types(caf::actor_system_config& cfg) {
  actors::add_message_types(cfg);
  add_api_message_types(cfg);
}

// The runtime's types and troupe's own scheduler (its workers and their
// sleep), then the API's types.
void configure_actor_system(caf::actor_system_config& cfg) {
  actors::configure_actor_system(cfg);
  add_api_message_types(cfg);
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
  // A failing job's flight recorder goes to a directory of its own.
  static std::atomic<int> jobs{0};
  if (config.trace.dir.empty() && config.trace.flight_dir.empty()) {
    config.trace.flight_dir =
        absl::StrCat(actors::default_flight_dir(), "/", config.name, "-", ++jobs);
  }
  if (absl::Status st = claim_save_dir(config.checkpoint.save, config.name); !st.ok()) return st;
  return system.spawn<JobActor>(std::move(config), subscriber);
}

}  // namespace troupe
