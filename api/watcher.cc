// JobWatcher: a `troupe launch` job's events, over its control channel
// (actors/runtime/watch_feed.h has the frames), as the API's messages.
#include <future>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "actors/runtime/watch_feed.h"
#include "comm/control_channel.h"
#include "troupe/troupe.h"

namespace troupe {

struct JobWatcher::Link {
  caf::actor subscriber;
  std::string name;
  std::mutex mu;
  std::promise<absl::StatusOr<Hello>> hello;
  bool said_hello = false;
  bool ended = false;
  int step = 0;
  std::unique_ptr<comm::ControlLink> link;

  void on_frame(const std::string& frame) {
    absl::StatusOr<actors::WatchEvent> e = actors::decode_watch_event(frame);
    std::lock_guard<std::mutex> lock(mu);
    if (!e.ok() || ended) return;
    if (!said_hello) {
      said_hello = true;
      if (e->kind != actors::WatchEvent::Kind::kHello) {
        hello.set_value(absl::DataLossError("the coordinator's first frame is not a hello"));
        return;
      }
      step = e->step;
      hello.set_value(
          Hello{.steps = e->steps, .step = e->step, .layout = e->layout, .model = e->model});
      return;
    }
    switch (e->kind) {
      case actors::WatchEvent::Kind::kHello:
        break;
      case actors::WatchEvent::Kind::kStep:
        step = e->metrics.step;
        caf::anon_send(subscriber, metrics_atom::value, name, e->metrics);
        if (e->metrics.val_loss) {
          caf::anon_send(subscriber, validation_atom::value, name, e->metrics.step,
                         *e->metrics.val_loss);
        }
        break;
      case actors::WatchEvent::Kind::kLog:
        caf::anon_send(subscriber, log_atom::value, name, e->text);
        break;
      case actors::WatchEvent::Kind::kCheckpoint:
        caf::anon_send(subscriber, checkpoint_atom::value, name, e->step, e->text);
        break;
      case actors::WatchEvent::Kind::kEnd:
        ended = true;
        if (!e->text.empty()) {
          if (e->stalled) caf::anon_send(subscriber, stall_atom::value, name, e->text);
          caf::anon_send(subscriber, failure_atom::value, name, e->text);
        }
        caf::anon_send(subscriber, ended_atom::value, name, step, e->text);
        break;
    }
  }

  void on_lost(const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (!said_hello) {
      said_hello = true;
      hello.set_value(
          absl::UnavailableError(absl::StrCat("the coordinator went away: ", why.message())));
      return;
    }
    if (ended) return;
    ended = true;
    const std::string what =
        absl::StrCat("lost the job's coordinator (the job ended, restarted or was cut off): ",
                     why.ok() ? "it closed the connection" : std::string(why.message()));
    caf::anon_send(subscriber, failure_atom::value, name, what);
    caf::anon_send(subscriber, ended_atom::value, name, step, what);
  }
};

absl::StatusOr<std::unique_ptr<JobWatcher>> JobWatcher::attach(const Options& options,
                                                               const caf::actor& subscriber) {
  if (!subscriber) return absl::InvalidArgumentError("JobWatcher::attach: no subscriber");
  if (options.token.empty()) {
    return absl::InvalidArgumentError("JobWatcher::attach: no job token (it is refused without)");
  }
  std::unique_ptr<JobWatcher> w(new JobWatcher());
  w->link_ = std::make_unique<Link>();
  Link* link = w->link_.get();
  link->subscriber = subscriber;
  link->name = options.name;
  std::future<absl::StatusOr<Hello>> hello = link->hello.get_future();
  std::random_device rd;
  const int id = actors::kWatcherBase + static_cast<int>(rd() % (1u << 29));
  absl::StatusOr<std::unique_ptr<comm::ControlLink>> c = comm::ControlLink::connect(
      options.host, options.port, id, actors::kWatchHello,
      {.token = options.token,
       .handshake = absl::Seconds(options.connect_timeout_s),
       .log = [](const std::string&) {},
       .peer_name = "watcher"},
      [link](std::string frame) { link->on_frame(frame); },
      [link](absl::Status why) { link->on_lost(why); });
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat("attaching to ", options.host, ":",
                                                        options.port, ": ", c.status().message()));
  }
  link->link = *std::move(c);
  if (hello.wait_for(std::chrono::duration<double>(options.connect_timeout_s)) !=
      std::future_status::ready) {
    return absl::DeadlineExceededError(
        absl::StrCat("attaching to ", options.host, ":", options.port, ": no hello from the job"));
  }
  absl::StatusOr<Hello> h = hello.get();
  if (!h.ok())
    return absl::Status(h.status().code(), absl::StrCat("attaching to ", options.host, ":",
                                                        options.port, ": ", h.status().message()));
  w->hello_ = *std::move(h);
  return w;
}

JobWatcher::~JobWatcher() {
  if (link_) link_->link.reset();  // (says goodbye; no callback after it)
}

}  // namespace troupe
