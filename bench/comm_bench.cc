// troupe's comm/ over UCX, one process per rank (started by bench/report.py):
//   --mode p2p        rank 0 -> rank 1: bandwidth (a window of 16 sends in
//                     flight) and ping-pong latency, per size
//   --mode allreduce  all-reduce of fp32 buffers; busbw as nccl-tests:
//                     bytes / time * 2(n-1)/n
//   --inproc          the all-reduce among threads of one process instead
//                     (the in-process transport, as `troupe train`'s TP groups)
//   --mode chain      a pipeline's hops with nothing around them (as
//                     bench/comm_mpi.cc's and comm_gloo.cc's `chain`, for
//                     bench/hop_bench.py): --min-bytes down from rank 0 to
//                     the last rank and back, a step, --iters steps; a rank
//                     posts its receives first, waits for each, and sends
//                     as a stage's stream does (posted and driven through
//                     on this thread below 64 KiB); prints the median step
// Rank 0 prints one JSON object per measurement.
#include <sched.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/chain_report.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/inproc_transport.h"
#include "comm/ucx_transport.h"

namespace {

using Clock = std::chrono::steady_clock;
using troupe::comm::Callback;

double secs(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Posts `ops` and waits for all of them.
absl::Status wait_all(int count, const std::function<void(int, Callback)>& post) {
  std::vector<std::promise<absl::Status>> ps(static_cast<std::size_t>(count));
  for (int i = 0; i < count; i++)
    post(i, [&ps, i](absl::Status st) { ps[static_cast<std::size_t>(i)].set_value(st); });
  absl::Status first;
  for (auto& p : ps) {
    absl::Status st = p.get_future().get();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

int p2p(int rank, troupe::comm::Transport& t, std::size_t min_bytes, std::size_t max_bytes) {
  const int peer = 1 - rank;
  // Latency: 8-byte ping-pong.
  {
    char buf[8] = {};
    const int iters = 2000;
    auto t0 = Clock::now();
    for (int i = 0; i < iters; i++) {
      if (rank == 0) {
        (void)wait_all(1, [&](int, Callback cb) { t.send(peer, 1, buf, 8, cb); });
        (void)wait_all(1, [&](int, Callback cb) { t.recv(peer, 2, buf, 8, cb); });
      } else {
        (void)wait_all(1, [&](int, Callback cb) { t.recv(peer, 1, buf, 8, cb); });
        (void)wait_all(1, [&](int, Callback cb) { t.send(peer, 2, buf, 8, cb); });
      }
    }
    if (rank == 0) {
      std::printf(
          "{\"impl\": \"troupe-ucx\", \"op\": \"p2p_lat\", \"n\": 2, \"bytes\": 8, \"time_us\": "
          "%.3f}\n",
          secs(t0) / (2.0 * iters) * 1e6);
    }
  }
  std::vector<char> buf(max_bytes, 1);
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int window = 16;
    const int iters =
        static_cast<int>(std::clamp<std::size_t>((256u << 20) / (bytes * window), 2, 200));
    char ack = 0;
    auto round = [&](int tag) {
      if (rank == 0) {
        (void)wait_all(window, [&](int i, Callback cb) {
          t.send(peer, static_cast<troupe::comm::Tag>(tag * 64 + i), buf.data(), bytes, cb);
        });
        (void)wait_all(1, [&](int, Callback cb) { t.recv(peer, 7, &ack, 1, cb); });
      } else {
        (void)wait_all(window, [&](int i, Callback cb) {
          t.recv(peer, static_cast<troupe::comm::Tag>(tag * 64 + i), buf.data(), bytes, cb);
        });
        (void)wait_all(1, [&](int, Callback cb) { t.send(peer, 7, &ack, 1, cb); });
      }
    };
    round(1);  // warm-up
    auto t0 = Clock::now();
    for (int i = 0; i < iters; i++) round(2 + i % 2);
    const double s = secs(t0);
    if (rank == 0) {
      const double per_msg = s / (static_cast<double>(iters) * window);
      std::printf(
          "{\"impl\": \"troupe-ucx\", \"op\": \"p2p_bw\", \"n\": 2, \"bytes\": %zu, \"time_us\": "
          "%.3f, "
          "\"bw_GBps\": %.4f}\n",
          bytes, per_msg * 1e6, static_cast<double>(bytes) / per_msg / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}

int allreduce(int rank, int size, troupe::comm::Transport& t, std::size_t min_bytes,
              std::size_t max_bytes, const troupe::comm::CommunicatorOptions& options,
              int fixed_iters, const char* impl) {
  std::vector<int> ranks(static_cast<std::size_t>(size));
  for (int i = 0; i < size; i++) ranks[static_cast<std::size_t>(i)] = i;
  troupe::comm::Communicator c(t, ranks, troupe::comm::GroupKind::kWorld, options);
  std::vector<float> x(max_bytes / 4, 1.0f);
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / 4;
    const int iters =
        fixed_iters > 0 ? fixed_iters
                        : static_cast<int>(std::clamp<std::size_t>((512u << 20) / bytes, 3, 2000));
    if (!c.all_reduce_sync(x.data(), n).ok()) return 1;  // warm-up
    float one = 0;
    (void)c.all_reduce_sync(&one, 1);  // line up the ranks
    auto t0 = Clock::now();
    for (int i = 0; i < iters; i++) {
      absl::Status st = c.all_reduce_sync(x.data(), n);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    const double per = secs(t0) / iters;
    if (rank == 0) {
      const double busbw = static_cast<double>(bytes) / per * 2.0 * (size - 1) / size / 1e9;
      std::printf(
          "{\"impl\": \"%s\", \"op\": \"allreduce\", \"n\": %d, \"bytes\": %zu, "
          "\"time_us\": %.3f, "
          "\"busbw_GBps\": %.4f}\n",
          impl, size, bytes, per * 1e6, busbw);
      std::fflush(stdout);
    }
  }
  return 0;
}

int chain(int rank, int size, troupe::comm::Transport& t, std::size_t bytes, int steps) {
  std::vector<char> act(bytes), grad(bytes);
  constexpr std::size_t kDriveMaxBytes = 64 << 10;           // (actors/shard_ops.cc's)
  using Done = std::shared_ptr<std::promise<absl::Status>>;  // (held by the callback too)
  auto post = [](const Done& p) { return [p](absl::Status st) { p->set_value(std::move(st)); }; };
  auto made = [] { return std::make_shared<std::promise<absl::Status>>(); };
  std::vector<double> times(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; s++) {
    // (Tags by step, as the runtime's: a message is never matched to another step's.)
    const auto fwd = static_cast<troupe::comm::Tag>(2 * s), bwd = fwd + 1;
    const bool first = rank == 0, last = rank == size - 1;
    const Done got_act = made(), got_grad = made(), sent_act = made(), sent_grad = made();
    const auto t0 = Clock::now();
    // The receives first, as a stage posts them when it fires the ops behind them.
    if (!first) t.recv(rank - 1, fwd, act.data(), bytes, post(got_act));
    if (!last) t.recv(rank + 1, bwd, grad.data(), bytes, post(got_grad));
    auto send = [&](int to, troupe::comm::Tag tag, const char* data, const Done& p) {
      troupe::comm::DriveScope scope(bytes < kDriveMaxBytes ? &t : nullptr);
      t.send(to, tag, data, bytes, post(p));
      if (bytes < kDriveMaxBytes) t.poll();
    };
    absl::Status st;
    std::vector<std::future<absl::Status>> sends;
    if (!first) st = got_act->get_future().get();
    if (!last && st.ok()) {
      send(rank + 1, fwd, act.data(), sent_act);
      sends.push_back(sent_act->get_future());
      st = got_grad->get_future().get();
    }
    if (!first && st.ok()) {
      send(rank - 1, bwd, grad.data(), sent_grad);
      sends.push_back(sent_grad->get_future());
    }
    for (auto& f : sends) {  // (before the buffers are used again)
      absl::Status sst = f.get();
      if (st.ok()) st = sst;
    }
    if (!st.ok()) {  // (a receive still posted may write into `act`: no return)
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(st.message()).c_str());
      std::_Exit(1);
    }
    times[static_cast<std::size_t>(s)] = secs(t0);
  }
  // (rank 0's step spans the others')
  if (rank == 0) print_chain_step("troupe-ucx", size, bytes, std::move(times));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe comm/ benchmark: one rank"};
  int rank = 0, size = 2, port = 29511;
  std::string mode = "allreduce";
  std::size_t min_bytes = 4096, max_bytes = 256u << 20;
  app.add_option("--rank", rank);
  app.add_option("--size", size);
  app.add_option("--port", port);
  app.add_option("--mode", mode)->check(CLI::IsMember({"p2p", "allreduce", "chain"}));
  app.add_option("--min-bytes", min_bytes);
  app.add_option("--max-bytes", max_bytes);
  int bind_core = -1;
  int iters = 0;
  app.add_option(
      "--iters", iters,
      "All-reduces timed at each size (0: 512 MiB worth, 3 to 2000; more for a profile); "
      "with --mode chain, steps (0: 2000)");
  troupe::comm::CommunicatorOptions options;
  app.add_option("--slice-bytes", options.slice_bytes, "Ring/chain pipelining granularity")
      ->capture_default_str();
  app.add_option("--read-piece-bytes", options.read_piece_bytes,
                 "Pieces in which a received slice is read and added")
      ->capture_default_str();
  app.add_option("--direct-max-bytes", options.direct_max_bytes,
                 "All-reduce by direct exchange up to this size")
      ->capture_default_str();
  app.add_option("--halving-max-bytes", options.halving_max_bytes,
                 "All-reduce by recursive halving/doubling up to this size (p a power of two)")
      ->capture_default_str();
  app.add_option("--copies-max-bytes", options.copies_max_bytes,
                 "A collective up to this size moves its messages by copies through shared "
                 "memory, not by the single-copy protocol")
      ->capture_default_str();
  app.add_flag("!--no-shared-memory", options.shared_memory,
               "Every all-reduce by the transport's messages");
  bool inproc = false;
  app.add_flag("--inproc", inproc,
               "All-reduce with every rank a thread of this process (comm/inproc_transport.h), "
               "as a tensor-parallel group of `troupe train` runs; --rank and --port unused");
  app.add_option("--bind-core", bind_core,
                 "Pin this process (all its threads) to one core, as mpirun binds its ranks");
  CLI11_PARSE(app, argc, argv);
  if (bind_core >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(bind_core, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      std::perror("comm_bench: --bind-core");
      return 1;
    }
  }
  if (inproc) {
    if (mode != "allreduce") {
      std::fprintf(stderr, "comm_bench: --inproc measures --mode allreduce only\n");
      return 1;
    }
    auto fabric = std::make_shared<troupe::comm::InProcFabric>(size);
    std::vector<int> rcs(static_cast<std::size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; r++) {
      threads.emplace_back([&, r, t = fabric->endpoint(r)] {
        rcs[static_cast<std::size_t>(r)] =
            allreduce(r, size, *t, min_bytes, max_bytes, options, iters, "troupe-inproc");
      });
    }
    for (auto& th : threads) th.join();
    return *std::max_element(rcs.begin(), rcs.end());
  }
  // (Every rank on this host, as troupe launch runs them on one: UCX without TCP.)
  auto w = troupe::comm::connect_ucx(rank, size, "127.0.0.1", port, absl::Seconds(60), {},
                                     {.one_host = true, .because = "comm_bench's ranks"});
  if (!w.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(w.status().message()).c_str());
    return 1;
  }
  troupe::comm::Transport& t = *w->transport;
  const int rc = mode == "p2p" ? p2p(rank, t, min_bytes, max_bytes)
                 : mode == "chain"
                     ? chain(rank, size, t, min_bytes, iters > 0 ? iters : 2000)
                     : allreduce(rank, size, t, min_bytes, max_bytes, options, iters, "troupe-ucx");
  (void)w->bootstrap->finish();
  return rc;
}
