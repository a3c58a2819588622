// One rank of a multi-process run: join, connect, run, end.
#include "actors/runtime/worker.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actors/messages.h"
#include "actors/runtime/coordinator_stand_in.h"
#include "actors/runtime/remote.h"
#include "actors/runtime/request_relay.h"
#include "comm/tag.h"
#include "comm/trace.h"
#include "comm/ucx_transport.h"
#include "model/weights.h"

namespace troupe::actors {
namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// What the control link's thread tells the rank's main thread.
struct LinkState {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<std::vector<std::string>> addresses;  // the world message
  std::optional<absl::Status> ended;                  // the end message
  std::optional<absl::Status> lost;                   // the coordinator is gone
  bool bye = false;                                   // every rank is done: the transport may go
  // Set once the actors are up; frames for them before that are dropped.
  caf::actor shard, optimizer, relay;
  std::optional<std::pair<std::int64_t, std::int64_t>> clock;  // a probe's answer (t0, tc)
  std::function<void(const std::string&)> write_trace;         // the coordinator asks (SIGUSR1)

  bool over() const { return ended.has_value() || lost.has_value(); }
};

void on_frame(caf::actor_system& system, LinkState& s, const std::string& frame,
              const std::function<void(const std::string&)>& log) {
  absl::StatusOr<Envelope> e = decode_envelope(system, frame, /*allow_string_lists=*/true);
  if (!e.ok()) return log(absl::StrCat("a frame from the coordinator: ", e.status().message()));
  std::unique_lock<std::mutex> lock(s.mu);
  if (e->to == Target::kControl) {
    const caf::message& m = e->content;
    if (m.match_elements<remote_world_atom, std::vector<std::string>>()) {
      s.addresses = m.get_as<std::vector<std::string>>(1);
    } else if (m.match_elements<remote_end_atom, int, std::string>()) {
      const auto code = static_cast<absl::StatusCode>(m.get_as<int>(1));
      // (An OK code with a message would be no Status; a code CAF's peer
      // made up is Unknown.)
      s.ended =
          code == absl::StatusCode::kOk
              ? absl::OkStatus()
              : absl::Status(
                    code > absl::StatusCode::kUnauthenticated ? absl::StatusCode::kUnknown : code,
                    m.get_as<std::string>(2));
    } else if (m.match_elements<remote_bye_atom>()) {
      s.bye = true;
    } else if (m.match_elements<remote_clock_atom, std::int64_t, std::int64_t>()) {
      s.clock.emplace(m.get_as<std::int64_t>(1), m.get_as<std::int64_t>(2));
    } else if (m.match_elements<remote_trace_atom, std::string>() && s.write_trace) {
      auto write = s.write_trace;
      lock.unlock();
      write(m.get_as<std::string>(1));
      return;
    }
    s.cv.notify_all();
    return;
  }
  const caf::actor dest = e->to == Target::kShard       ? s.shard
                          : e->to == Target::kOptimizer ? s.optimizer
                                                        : caf::actor{};
  const caf::actor relay = s.relay;
  lock.unlock();
  if (!dest) return;
  if (e->request != 0) {
    caf::anon_send(relay, remote_request_atom::value, static_cast<std::uint8_t>(e->to), e->request,
                   std::move(e->content));
  } else {
    caf::anon_send(dest, std::move(e->content));
  }
}

// This rank's steady clock against the coordinator's: the probe with the
// shortest round trip (t0 sent, tc the coordinator's time, t1 answered)
// says offset = tc - (t0 + t1) / 2, within half that round trip.
struct ClockSync {
  std::int64_t offset_ns = 0;
  std::int64_t uncertainty_ns = -1;  // -1: not measured (no answer)
};

ClockSync probe_clock(caf::actor_system& system, const FrameSink& sink, LinkState& state,
                      int rank) {
  constexpr int kProbes = 8;
  ClockSync best;
  for (int i = 0; i < kProbes; i++) {
    std::unique_lock<std::mutex> lock(state.mu);
    state.clock.reset();
    lock.unlock();
    const std::int64_t t0 = comm::trace::now_ns();
    if (!sink(encode_envelope(system,
                              {.to = Target::kControl,
                               .content = caf::make_message(remote_clock_atom::value, rank, t0)}))
             .ok()) {
      break;
    }
    lock.lock();
    state.cv.wait_for(lock, std::chrono::seconds(1),
                      [&] { return (state.clock && state.clock->first == t0) || state.over(); });
    if (!state.clock || state.clock->first != t0) break;
    const std::int64_t t1 = comm::trace::now_ns();
    const std::int64_t half = (t1 - t0) / 2;
    if (best.uncertainty_ns < 0 || half < best.uncertainty_ns) {
      best.uncertainty_ns = half;
      best.offset_ns = state.clock->second - (t0 + half);
    }
  }
  return best;
}

// Trace writes the coordinator asks for, each on a thread of its own, all
// joined by finish() (or the destructor); none start after it.
class TraceDumps {
 public:
  ~TraceDumps() { finish(); }
  void start(std::function<void()> write) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) threads_.emplace_back(std::move(write));
  }
  void finish() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  std::mutex mu_;
  bool finished_ = false;
  std::vector<std::thread> threads_;
};

// Writes this rank's trace file; says where (or why not) in the log.
void write_rank_trace(const RankUnit& unit, const std::string& dir, const std::string& reason,
                      const std::string& message, const ClockSync& clock,
                      const std::function<void(const std::string&)>& log) {
  TraceHeader h;
  h.reason = reason;
  h.message = message;
  h.clock_offset_ns = clock.offset_ns;
  h.clock_uncertainty_ns = clock.uncertainty_ns;
  absl::Status st = unit.write_trace(dir, h);
  log(st.ok() ? absl::StrCat("trace (", reason, "): ", dir, "/", trace_file_name(unit.rank()))
              : absl::StrCat("trace (", reason, "): not written: ", st.message()));
}

// Blocking transport operations for the end of the run, each bounded: the
// control channel no longer watches the peers then.
constexpr auto kEndTimeout = std::chrono::seconds(60);
absl::Status finish_within(comm::Transport& t, int peer, std::future<absl::Status>& f) {
  if (f.wait_for(kEndTimeout) == std::future_status::timeout) {
    t.fail_peer(peer, absl::DeadlineExceededError("no answer within 60 s"));
  }
  return f.get();
}

absl::Status send_sync(comm::Transport& t, int peer, comm::Tag tag, const void* data,
                       std::size_t bytes) {
  auto p = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = p->get_future();
  t.send(
      peer, tag, data, bytes, [p](absl::Status st) { p->set_value(std::move(st)); }, nullptr);
  return finish_within(t, peer, f);
}

absl::Status recv_sync(comm::Transport& t, int peer, comm::Tag tag, void* data, std::size_t bytes) {
  auto p = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = p->get_future();
  t.recv(
      peer, tag, data, bytes, [p](absl::Status st) { p->set_value(std::move(st)); }, nullptr);
  return finish_within(t, peer, f);
}

comm::Tag weights_tag(int source, int chunk) {
  return comm::make_tag({.source = static_cast<std::uint32_t>(source),
                         .group = comm::GroupKind::kWorld,
                         .kind = comm::MessageKind::kControl,
                         .step = 0xFFFF,
                         .micro = 0,
                         .chunk = static_cast<std::uint32_t>(chunk),
                         .layer = 0});
}

}  // namespace

absl::Status gather_and_save_weights(RankUnit& unit, const RankSpec& spec,
                                     const std::string& path) {
  const ParallelOptions& par = spec.parallel;
  const comm::Layout layout = par.layout();
  if (spec.rank != 0) {
    if (unit.coord().d != 0) return absl::OkStatus();
    for (std::size_t ch = 0; ch < unit.chunks().size(); ch++) {
      const gpu::Tensor& p = unit.chunks()[ch]->params();
      absl::Status st = with_host_copy(p, /*write_back=*/false, [&](float* host) {
        return send_sync(unit.transport(), 0, weights_tag(spec.rank, static_cast<int>(ch)), host,
                         static_cast<std::size_t>(p.numel()) * 4);
      });
      if (!st.ok())
        return absl::UnavailableError(absl::StrCat("sending the weights: ", st.message()));
    }
    return absl::OkStatus();
  }
  const model::GptConfig& c = spec.options.model;
  model::Gpt whole(c, 1, gpu::cpu_device());
  for (int r = 0; r < layout.world(); r++) {
    const comm::Coord at = layout.coord(r);
    if (at.d != 0) continue;
    const std::vector<Chunk> theirs = r == 0 ? std::vector<Chunk>{} : rank_chunks(c, layout, at);
    for (int ch = 0; ch < par.virtual_stages; ch++) {
      if (r == 0) {
        const GptStage& mine = *unit.chunks()[static_cast<std::size_t>(ch)];
        absl::Status st = copy_into_whole({&mine}, whole);
        if (!st.ok()) return st;
        continue;
      }
      const model::ParamLayout& slice = theirs[static_cast<std::size_t>(ch)].params;
      std::vector<float> buf(static_cast<std::size_t>(slice.total()));
      absl::Status st =
          recv_sync(unit.transport(), r, weights_tag(r, ch), buf.data(), buf.size() * 4);
      if (!st.ok()) {
        return absl::UnavailableError(
            absl::StrCat("receiving the weights of rank ", r, ": ", st.message()));
      }
      if (st = copy_slice_into_whole(slice, buf.data(), whole); !st.ok()) return st;
    }
  }
  return model::save_weights(whole, path);
}

// RankUnit::connect() on a thread of its own, while this one watches the
// job: a job that ends meanwhile (a peer failed) ends it.
absl::Status connect_unit(RankUnit& unit, LinkState& state) {
  std::promise<absl::Status> done;
  std::future<absl::Status> result = done.get_future();
  std::thread connecting([&] {
    absl::Status st;
    try {
      st = unit.connect();
    } catch (const std::exception& e) {  // (it would end the process from this thread)
      st = absl::InternalError(absl::StrCat("connecting rank ", unit.rank(), ": ", e.what()));
    }
    done.set_value(st);
  });
  bool cancelled = false;
  while (result.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    bool over;
    {
      std::lock_guard<std::mutex> lock(state.mu);
      over = state.over();
    }
    if (over && !cancelled) {
      cancelled = true;
      unit.fail_pending(absl::CancelledError("the job stopped while the ranks connected"));
    }
  }
  connecting.join();
  return result.get();
}

int worker_caf_threads(bool uses_nccl, const char* nccl_runtime_connect) {
  const bool may_wait =
      uses_nccl && nccl_runtime_connect != nullptr && std::string_view(nccl_runtime_connect) != "0";
  return may_wait ? 2 : 1;
}

absl::Status run_worker(const WorkerOptions& o) {
  auto log = o.log ? o.log : [](const std::string& m) {
    std::fprintf(stderr, "troupe worker: %s\n", m.c_str());
  };
  const int world = o.spec.parallel.world();
  const bool uses_nccl = (o.spec.parallel.tp > 1 || o.spec.parallel.dp > 1) &&
                         o.spec.parallel.device != nullptr &&
                         o.spec.parallel.device->kind() == gpu::DeviceKind::kCuda;
  if (uses_nccl) {
    // TP and DP through NCCL (RankUnit::connect): every connection they use
    // made in its init, not at a collective's first call, which would wait
    // there for the peers on the actor's thread. Set before this process
    // starts the threads of UCX and CAF (setenv is not safe beside getenv);
    // a value the user gave stands.
    ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  }
  const int caf_threads = worker_caf_threads(uses_nccl, std::getenv("NCCL_RUNTIME_CONNECT"));

  absl::StatusOr<std::unique_ptr<comm::UcxTransport>> ucx = comm::UcxTransport::create(
      o.spec.rank, world, {.one_host = !o.one_host.empty(), .because = o.one_host});
  if (!ucx.ok()) return ucx.status();
  comm::UcxTransport* transport = ucx->get();
  absl::StatusOr<model::data::Datasets> data = model::build_run_datasets(o.spec.options);
  if (!data.ok()) return data.status();
  RankSpec spec = o.spec;
  spec.own_device = true;  // a process per rank, a GPU per process
  absl::StatusOr<std::unique_ptr<RankUnit>> unit = RankUnit::create(spec, *std::move(ucx));
  if (!unit.ok()) return unit.status();

  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  cfg.set("scheduler.max-threads", caf_threads);
  caf::actor_system system{cfg};
  LinkState state;
  TraceDumps dumps;  // before the link: its thread may start one until it stops
  const gpu::Device& device =
      spec.parallel.device != nullptr ? *spec.parallel.device : gpu::cpu_device();
  const RankHello hello{.host = host_name(),
                        .pid = static_cast<std::int32_t>(::getpid()),
                        .transport_address = transport->address(),
                        .has_valid = data->valid != nullptr,
                        .train_data = data->train->describe(),
                        .device = device_kind(device),
                        .device_name = device.name()};
  comm::ControlOptions control = o.control;
  control.token = o.token;
  control.handshake = o.join_timeout;  // the coordinator may not listen yet
  absl::StatusOr<std::unique_ptr<comm::ControlLink>> link = comm::ControlLink::connect(
      o.master_addr, o.master_port, o.spec.rank, encode_hello(system, hello), control,
      [&](std::string frame) { on_frame(system, state, frame, log); },
      [&](absl::Status why) {
        std::lock_guard<std::mutex> lock(state.mu);
        state.lost = std::move(why);
        state.cv.notify_all();
      });
  if (!link.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot join the coordinator at ", o.master_addr,
                                               ":", o.master_port, ": ", link.status().message()));
  }
  log(absl::StrCat("rank ", o.spec.rank, ": the control channel ",
                   (*link)->local() ? "through the coordinator's local socket" : "over TCP"));
  FrameSink sink = [l = link->get()](std::string frame) { return l->send(frame); };
  const ClockSync clock = probe_clock(system, sink, state, o.spec.rank);
  const TraceOptions& trace = o.spec.trace;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    state.write_trace = [&dumps, &trace, &log, clock,
                         unit = unit->get()](const std::string& reason) {
      dumps.start([&trace, &log, clock, unit, reason] {
        write_rank_trace(*unit, trace.failure_dir(), reason, "", clock, log);
      });
    };
  }
  // (Unset on every way out: `state` goes away with this function.)
  struct HookGuard {
    DumpHook* hook;
    ~HookGuard() {
      if (hook != nullptr) hook->set(nullptr);
    }
  } hook_guard{o.dump_hook};
  if (o.dump_hook != nullptr) {
    o.dump_hook->set([&state] {
      std::lock_guard<std::mutex> lock(state.mu);
      if (state.write_trace) state.write_trace("signal");
    });
  }

  // The peers' addresses, then the actors.
  std::vector<caf::actor> actors;
  {
    std::unique_lock<std::mutex> lock(state.mu);
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoSeconds(o.join_timeout);
    state.cv.wait_until(lock, deadline, [&] { return state.addresses || state.over(); });
    if (!state.addresses && !state.over()) {
      return absl::DeadlineExceededError(
          absl::StrCat("the job did not assemble within ", absl::FormatDuration(o.join_timeout),
                       " (the coordinator never sent the ranks' addresses)"));
    }
  }
  if (state.addresses) {
    if (absl::Status st = transport->connect(*state.addresses); !st.ok()) {
      (void)sink(
          encode_envelope(system, {.to = Target::kControl,
                                   .content = caf::make_message(
                                       failed_atom::value, o.spec.rank,
                                       absl::StrCat("connecting its transport: ", st.message()))}));
      return st;
    }
  }
  absl::Status connected = state.addresses ? connect_unit(**unit, state) : absl::OkStatus();
  if (!connected.ok()) {
    bool over;
    {
      std::lock_guard<std::mutex> lock(state.mu);
      over = state.over();
    }
    // Cancelled because the job ended: the ordinary end below says why.
    if (!over) {
      (void)sink(encode_envelope(system,
                                 {.to = Target::kControl,
                                  .content = caf::make_message(failed_atom::value, o.spec.rank,
                                                               std::string(connected.message()))}));
      // What connect made is aborted, not finalized with peers that will
      // not come (that waits 30 s a communicator).
      (*unit)->fail_pending(connected);
      return connected;
    }
  } else if (state.addresses) {
    caf::actor stand_in = system.spawn<CoordinatorStandIn>(sink);
    RankUnit::Actors a = (*unit)->spawn(
        system, {.coordinator = stand_in, .train = data->train.get(), .valid = data->valid.get()});
    caf::actor relay = system.spawn<RequestRelay>(a.shard, a.optimizer, sink);
    actors = {a.shard, a.optimizer, relay, stand_in};
    {
      std::lock_guard<std::mutex> lock(state.mu);
      state.shard = a.shard;
      state.optimizer = a.optimizer;
      state.relay = relay;
    }
    (void)sink(encode_envelope(
        system, {.to = Target::kControl,
                 .content = caf::make_message(remote_ready_atom::value, o.spec.rank)}));
  }
  // Until the end: the channel's heartbeats bound this wait.
  absl::Status outcome;
  {
    std::unique_lock<std::mutex> lock(state.mu);
    state.cv.wait(lock, [&] { return state.over(); });
    outcome = state.ended ? *state.ended
                          : absl::UnavailableError(
                                absl::StrCat("lost contact with the coordinator at ", o.master_addr,
                                             ":", o.master_port, ": ", state.lost->message()));
    state.shard = state.optimizer = state.relay = caf::actor{};
  }
  if (o.dump_hook != nullptr) o.dump_hook->set(nullptr);
  dumps.finish();
  // Before what is pending fails: the flight recorder shows what was open.
  if (!outcome.ok()) {
    write_rank_trace(**unit, trace.failure_dir(),
                     absl::IsDeadlineExceeded(outcome) ? "stall" : "failure",
                     std::string(outcome.message()), clock, log);
  } else if (!trace.dir.empty()) {
    write_rank_trace(**unit, trace.dir, "end", "", clock, log);
  }
  if (!outcome.ok()) (*unit)->fail_pending(absl::CancelledError("the job has stopped"));
  stop_actors(system, actors);
  absl::Status saved = absl::OkStatus();
  if (outcome.ok() && !o.save_weights.empty()) {
    saved = gather_and_save_weights(**unit, o.spec, o.save_weights);
  }
  // Done: wait until every rank is (a peer's last message to this rank may
  // still wait for this transport's acknowledgement), then go.
  (void)sink(encode_envelope(system,
                             {.to = Target::kControl,
                              .content = caf::make_message(remote_done_atom::value, o.spec.rank)}));
  bool bye = false;
  {
    std::unique_lock<std::mutex> lock(state.mu);
    state.cv.wait_for(lock, std::chrono::seconds(3600), [&] { return state.bye || state.lost; });
    bye = state.bye;
  }
  // Every rank done: the NCCL communicator is finalized with its peers,
  // not aborted (a run that failed, or lost the coordinator, aborts it).
  if (outcome.ok() && bye) {
    (*unit)->end_pending(absl::CancelledError("the run has ended"));
  } else {
    (*unit)->fail_pending(absl::CancelledError("the run has ended"));
  }
  (*unit)->drain();
  link->reset();  // goodbye: the coordinator hears OK
  log(absl::StrCat("rank ", o.spec.rank, " on ", hello.host, ": single-copy bytes ",
                   transport->single_copy_bytes(), "; lanes: ", transport->describe_lanes()));
  if (!outcome.ok()) {
    if (state.ended)
      return absl::AbortedError(absl::StrCat("the job stopped: ", outcome.message()));
    return outcome;
  }
  return saved;
}

}  // namespace troupe::actors
