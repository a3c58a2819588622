// The coordinator of a multi-process run: joining, the run, the end.
#include "actors/runtime/coordinator_host.h"

#include <cstdio>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actors/coordinator.h"
#include "actors/messages.h"
#include "comm/trace.h"

namespace troupe::actors {

CoordinatorHost::CoordinatorHost(CoordinatorHostOptions options)
    : options_(std::move(options)), world_(options_.parallel.world()) {
  configure_actor_system(cfg_);
  system_ = std::make_unique<caf::actor_system>(cfg_);
  members_.resize(static_cast<std::size_t>(world_));
  if (!options_.log) {
    options_.log = [](const std::string& m) { std::fprintf(stderr, "troupe: %s\n", m.c_str()); };
  }
}

absl::StatusOr<std::unique_ptr<CoordinatorHost>> CoordinatorHost::listen(
    CoordinatorHostOptions options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError("the coordinator needs a job token");
  }
  std::unique_ptr<CoordinatorHost> h(new CoordinatorHost(std::move(options)));
  h->feed_ = std::make_unique<WatchFeed>();
  const RunCheckpoints& c = h->options_.checkpoints;
  if (c.loaded != nullptr && c.flags.load_optim) h->feed_->set_step(c.loaded->meta().step);
  comm::ControlOptions control = h->options_.control;
  control.token = h->options_.token;
  control.log = h->options_.log;
  CoordinatorHost* self = h.get();
  comm::ControlHub::Handlers handlers{
      .on_join = [self](int rank, const std::string& hello) { return self->on_join(rank, hello); },
      .on_frame = [self](int rank, std::string frame) { self->on_frame(rank, std::move(frame)); },
      .on_lost = [self](int rank, absl::Status why) { self->on_lost(rank, std::move(why)); }};
  absl::StatusOr<std::unique_ptr<comm::ControlHub>> hub = comm::ControlHub::listen(
      h->options_.listen_host, h->options_.port, std::move(control), std::move(handlers));
  if (!hub.ok()) return hub.status();
  h->hub_ = *std::move(hub);
  h->feed_->start(h->hub_.get());
  return h;
}

CoordinatorHost::~CoordinatorHost() {
  // The stand-ins send through the hub: they go first.
  std::vector<caf::actor> actors = shards_;
  actors.insert(actors.end(), optimizers_.begin(), optimizers_.end());
  if (coordinator_) actors.push_back(coordinator_);
  if (!actors.empty()) stop_actors(*system_, actors);
  if (feed_) feed_->close();  // (what is queued for the watchers goes first)
  hub_.reset();               // no handler runs after this
}

std::vector<CoordinatorHost::Member> CoordinatorHost::members() const {
  std::lock_guard<std::mutex> lock(mu_);
  return members_;
}

std::string CoordinatorHost::who(int rank) const {
  const comm::Coord c = options_.parallel.layout().coord(rank);
  std::string s = absl::StrCat("rank ", rank, " (d=", c.d, " s=", c.s, " t=", c.t, ")");
  std::lock_guard<std::mutex> lock(mu_);
  if (rank >= 0 && rank < world_ && members_[static_cast<std::size_t>(rank)].joined) {
    const RankHello& h = members_[static_cast<std::size_t>(rank)].hello;
    absl::StrAppend(&s, " on host ", h.host, ", pid ", h.pid);
  }
  return s;
}

bool CoordinatorHost::on_join(int rank, const std::string& hello) {
  if (rank >= kWatcherBase) {
    if (hello != kWatchHello) {
      options_.log(absl::StrCat("refused a watcher: its hello is not ", kWatchHello));
      return false;
    }
    const bool added = feed_->add(rank, [this](int step) {
      WatchEvent e;
      e.kind = WatchEvent::Kind::kHello;
      e.steps = options_.options.steps;
      e.step = step;
      e.layout = options_.parallel.layout().describe();
      e.model = options_.options.model.describe();
      return encode_watch_event(e);
    });
    if (!added) options_.log("refused a watcher: 64 watch already");
    return added;
  }
  if (rank >= world_) {
    options_.log(absl::StrCat("refused a rank ", rank, ": the job has ", world_, " ranks"));
    return false;
  }
  absl::StatusOr<RankHello> h = decode_hello(*system_, hello);
  std::lock_guard<std::mutex> lock(mu_);
  Member& m = members_[static_cast<std::size_t>(rank)];
  if (!h.ok() || m.joined || outcome_) {
    options_.log(absl::StrCat(
        "refused rank ", rank, ": ",
        !h.ok() ? h.status().message() : (m.joined ? "it has joined already" : "the run is over")));
    return false;
  }
  m.joined = true;
  m.hello = *std::move(h);
  joined_++;
  cv_.notify_all();
  return true;
}

bool CoordinatorHost::allowed(int rank, const Envelope& e) const {
  const caf::message& m = e.content;
  const comm::Coord c = options_.parallel.layout().coord(rank);
  switch (e.to) {
    case Target::kCoordinator:
      if (m.match_elements<loss_atom, int, int, int, double>()) {
        const int j = m.get_as<int>(3);
        // (From the stage with the head: the last, or in zbv's V the first.)
        const comm::Layout& l = options_.parallel.layout();
        return m.get_as<int>(2) == c.d && c.s == l.stage_of(l.chunks() - 1) && j >= 0 &&
               j < options_.parallel.m(options_.options);
      }
      if (m.match_elements<norm_atom, int, int, double>() ||
          m.match_elements<ready_atom, int, int>()) {
        return m.get_as<int>(2) == rank;
      }
      if (m.match_elements<snapshot_atom, int, int, std::string>() ||
          m.match_elements<saved_atom, int, int, std::string, std::string>()) {
        return m.get_as<int>(2) == rank;
      }
      return m.match_elements<failed_atom, int, std::string>() && m.get_as<int>(1) == rank;
    case Target::kReply:
      return m.match_elements<WaitReport>() &&
             (e.actor == static_cast<std::uint8_t>(Target::kShard) ||
              e.actor == static_cast<std::uint8_t>(Target::kOptimizer));
    case Target::kControl:
      return (m.match_elements<remote_ready_atom, int>() ||
              m.match_elements<remote_done_atom, int>() ||
              m.match_elements<remote_clock_atom, int, std::int64_t>() ||
              m.match_elements<failed_atom, int, std::string>()) &&
             m.get_as<int>(1) == rank;
    default:
      return false;  // ranks do not address each other's actors here
  }
}

void CoordinatorHost::on_frame(int rank, std::string frame) {
  if (rank >= kWatcherBase) {  // a watcher only listens
    hub_->drop(rank, absl::DataLossError("a watcher sent a frame"));
    return;
  }
  absl::StatusOr<Envelope> e = decode_envelope(*system_, frame);
  if (e.ok() && !allowed(rank, *e)) {
    e = absl::InvalidArgumentError(
        absl::StrCat("a message it may not send: ", caf::to_string(e->content).substr(0, 200)));
  }
  if (!e.ok()) {
    hub_->drop(rank, absl::DataLossError(e.status().message()));
    return;
  }
  if (e->to == Target::kControl &&
      e->content.match_elements<remote_clock_atom, int, std::int64_t>()) {
    // A clock probe: answered at once, with this process's steady clock.
    (void)hub_->send(
        rank,
        encode_envelope(*system_, {.to = Target::kControl,
                                   .content = caf::make_message(remote_clock_atom::value,
                                                                e->content.get_as<std::int64_t>(2),
                                                                comm::trace::now_ns())}));
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  Member& member = members_[static_cast<std::size_t>(rank)];
  if (e->to == Target::kControl) {
    if (e->content.match_elements<remote_ready_atom, int>() && !member.ready) {
      member.ready = true;
      ready_++;
    } else if (e->content.match_elements<remote_done_atom, int>() && !member.done) {
      member.done = true;
      done_++;
    } else if (e->content.match_elements<failed_atom, int, std::string>()) {
      // It could not get ready (its transport, say): the run ends with why.
      const std::string what = e->content.get_as<std::string>(2);
      lock.unlock();
      end(rank_report(rank, absl::StrCat(who(rank), ": ", what)));
      return;
    }
    cv_.notify_all();
    return;
  }
  if (!running_) return;
  if (e->to == Target::kCoordinator) {
    caf::actor c = coordinator_;
    lock.unlock();
    caf::anon_send(c, std::move(e->content));
  } else {
    const std::vector<caf::actor>& of =
        e->actor == static_cast<std::uint8_t>(Target::kShard) ? shards_ : optimizers_;
    caf::actor a = of[static_cast<std::size_t>(rank)];
    lock.unlock();
    caf::anon_send(a, remote_reply_atom::value, e->request, std::move(e->content));
  }
}

void CoordinatorHost::on_lost(int rank, absl::Status why) {
  if (rank >= kWatcherBase) return feed_->remove(rank);
  const std::string what = why.ok() ? "left before the run ended" : std::string(why.message());
  const std::string whom = who(rank);
  caf::actor shard, optimizer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Member& m = members_[static_cast<std::size_t>(rank)];
    if (!m.done) {  // a lost rank is not waited for at the end
      m.done = true;
      done_++;
      cv_.notify_all();
    }
    if (outcome_) {  // the run is over: ranks leave (unless it was this loss)
      blame_locked(rank, absl::UnavailableError(absl::StrCat(whom, ": lost contact: ", what)));
      return;
    }
    if (running_) {
      shard = shards_[static_cast<std::size_t>(rank)];
      optimizer = optimizers_[static_cast<std::size_t>(rank)];
    }
  }
  end(absl::UnavailableError(absl::StrCat(whom, ": lost contact: ", what)), rank);
  if (shard) caf::anon_send(shard, remote_lost_atom::value, what);
  if (optimizer) caf::anon_send(optimizer, remote_lost_atom::value, what);
}

void CoordinatorHost::end(absl::Status st, int lost) {
  std::lock_guard<std::mutex> lock(mu_);
  if (outcome_) {
    if (lost >= 0) blame_locked(lost, std::move(st));
    return;
  }
  outcome_ = std::move(st);
  cv_.notify_all();
}

// A rank that reports a failure may have seen a peer die: a copy from its
// process fails (ESRCH) as soon as the process is going, while its control
// link closes once its last thread is gone, and the launcher sees the exit
// at its next poll. So the loss, heard within the grace, is the cause, and
// the report what it led to.
void CoordinatorHost::blame_locked(int lost, absl::Status loss) {
  if (settled_ || !outcome_) return;
  const auto reporter = outcome_->GetPayload(kRankReportPayload);  // (absl::optional)
  // (The reporter's own exit after its report -- a rank that could not get
  // ready exits -- is what the report said.)
  if (!reporter || *reporter == std::to_string(lost)) return;
  outcome_ = absl::Status(loss.code(),
                          absl::StrCat(loss.message(), "; before that, ", outcome_->message()));
  cv_.notify_all();
}

void CoordinatorHost::cancel(absl::Status why) { end_run(std::move(why), -1); }

void CoordinatorHost::lose(int rank, absl::Status why) { end_run(std::move(why), rank); }

void CoordinatorHost::end_run(absl::Status why, int lost) {
  end(std::move(why), lost);
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

bool CoordinatorHost::wait_for_all(const int& count, bool Member::*done, const char* what) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoSeconds(options_.join_timeout);
  cv_.wait_until(lock, deadline, [&] { return count == world_ || outcome_.has_value(); });
  if (outcome_) return false;
  if (count == world_) return true;
  std::vector<int> missing;
  for (int r = 0; r < world_; r++) {
    if (!(members_[static_cast<std::size_t>(r)].*done)) missing.push_back(r);
  }
  outcome_ = absl::DeadlineExceededError(absl::StrCat(
      world_ - count, " of ", world_, " ranks did not ", what, " within ",
      absl::FormatDuration(options_.join_timeout),
      missing.empty() ? "" : absl::StrCat(" (ranks ", absl::StrJoin(missing, ", "), ")")));
  return false;
}

void CoordinatorHost::publish_log(const std::string& line) {
  WatchEvent e;
  e.kind = WatchEvent::Kind::kLog;
  e.text = line;
  feed_->publish(e);
}

void CoordinatorHost::request_traces(const std::string& reason) {
  broadcast(
      {.to = Target::kControl, .content = caf::make_message(remote_trace_atom::value, reason)});
}

void CoordinatorHost::broadcast(const Envelope& e) {
  const std::string frame = encode_envelope(*system_, e);
  for (int r = 0; r < world_; r++) (void)hub_->send(r, frame);
}

absl::Status CoordinatorHost::run(const std::function<void(const model::StepMetrics&)>& on_step,
                                  const OnJoined& on_joined) {
  if (wait_for_all(joined_, &Member::joined, "join")) {
    std::vector<std::string> addresses;
    std::vector<RankHello> hellos;
    for (const Member& m : members()) {
      addresses.push_back(m.hello.transport_address);
      hellos.push_back(m.hello);
    }
    if (on_joined) on_joined(members());
    if (absl::Status st = check_same_device(hellos); !st.ok()) {
      end(std::move(st));
    } else {
      broadcast({.to = Target::kControl,
                 .content = caf::make_message(remote_world_atom::value, std::move(addresses))});
      if (wait_for_all(ready_, &Member::ready, "get ready")) (void)run_coordinator(on_step);
    }
  }
  absl::Status st;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return outcome_.has_value(); });
    // A rank's report waits a moment for the loss that may be its cause.
    cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.blame_grace),
                 [&] { return aborted_ || !outcome_->GetPayload(kRankReportPayload); });
    settled_ = true;
    outcome_->ErasePayload(kRankReportPayload);  // (ToString() would print it)
    st = *outcome_;
  }
  feed_->publish({.kind = WatchEvent::Kind::kEnd,
                  .steps = 0,
                  .step = 0,
                  .layout = "",
                  .model = "",
                  .metrics = {},
                  .text = std::string(st.message()),
                  // (a deadline before the run, e.g. joining, is no stall)
                  .stalled = absl::IsDeadlineExceeded(st) && coordinator_started_});
  finish_ranks(st);
  return st;
}

// Tells every rank the end, waits until every one is done (it has stopped
// its actors and, with --save-weights, sent its slice or written the file)
// or lost, then lets them go; the coordinator and the stand-ins are stopped
// before run() returns. A successful run's ranks get long to finish (rank 0
// may be writing a large file), a failed one's 30 s; cancel() cuts it short.
void CoordinatorHost::finish_ranks(const absl::Status& st) {
  broadcast({.to = Target::kControl,
             .content = caf::make_message(remote_end_atom::value, static_cast<int>(st.code()),
                                          std::string(st.message()))});
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() +
                          (st.ok() ? std::chrono::seconds(3600) : std::chrono::seconds(30));
    cv_.wait_until(lock, deadline, [&] { return done_ >= joined_ || aborted_; });
    running_ = false;  // no frame reaches the coordinator any more
  }
  broadcast({.to = Target::kControl, .content = caf::make_message(remote_bye_atom::value)});
  std::vector<caf::actor> actors = shards_;
  actors.insert(actors.end(), optimizers_.begin(), optimizers_.end());
  if (coordinator_) actors.push_back(coordinator_);
  stop_actors(*system_, actors);
  std::lock_guard<std::mutex> lock(mu_);
  shards_.clear();
  optimizers_.clear();
  coordinator_ = caf::actor{};
}

absl::Status CoordinatorHost::run_coordinator(
    const std::function<void(const model::StepMetrics&)>& on_step) {
  auto setup = std::make_shared<CoordinatorSetup>();
  setup->options = options_.options;
  setup->layout = options_.parallel.layout();
  setup->shape = options_.parallel.layout();
  setup->m = options_.parallel.m(options_.options);
  setup->stall_timeout_s = options_.parallel.stall_timeout_s;
  setup->on_finish = [this](absl::Status st) { end(std::move(st)); };
  setup->mark_rank_reports = true;
  set_checkpoints(setup.get(), options_.checkpoints, options_.parallel);
  // Everything the user hears reaches the watchers too.
  setup->on_step = [this, on_step](const model::StepMetrics& m) {
    WatchEvent e;
    e.kind = WatchEvent::Kind::kStep;
    e.metrics = m;
    feed_->publish(e);
    if (on_step) on_step(m);
  };
  setup->log = [this, log = setup->log](const std::string& line) {
    publish_log(line);
    if (log) log(line);
  };
  setup->on_checkpoint = [this, saved = setup->on_checkpoint](int step, const std::string& dir) {
    WatchEvent e;
    e.kind = WatchEvent::Kind::kCheckpoint;
    e.step = step;
    e.text = dir;
    feed_->publish(e);
    if (saved) saved(step, dir);
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    setup->has_valid = members_[0].hello.has_valid;
    for (const Member& m : members_) setup->hosts.push_back(m.hello.host);
    for (int r = 0; r < world_; r++) {
      auto sink = [hub = hub_.get(), r](std::string frame) { return hub->send(r, frame); };
      shards_.push_back(system_->spawn<RemoteActor>(Target::kShard, sink));
      optimizers_.push_back(system_->spawn<RemoteActor>(Target::kOptimizer, sink));
    }
    setup->shards = shards_;
    setup->optimizers = optimizers_;
    coordinator_ = system_->spawn<Coordinator>(setup);
    running_ = true;
    coordinator_started_ = true;
  }
  caf::anon_send(coordinator_, start_atom::value);
  return absl::OkStatus();
}

}  // namespace troupe::actors
