// One rank of a multi-process UCX test (run by tests/comm/ucx_test.cc):
// bootstrap over TCP, UCX transport, a world communicator, then a scenario.
//   collectives   every collective at sizes 0, 1, 7, 1000, 100003, 600001, exact
//                 integer-valued sums (slices of 64 KiB: large enough for the
//                 single-copy protocol), and the all-reduce of values whose
//                 sums depend on their order the same bits with and without
//                 shared memory; prints the bytes it received by single copy
//                 and the all-reduces done through shared memory, then "ok"
//   kill          all-reduces of 16 MiB in a loop (of 2 or more ranks through
//                 shared memory); rank --victim kills itself mid-operation;
//                 every other rank must get an error naming it (prints the
//                 wall-clock times the driver turns into a detection time)
//   kill_messages the same with the all-reduce's bytes in transport messages
//   kill_copies   2 ranks, all-reduces of 1 MiB by copies through UCX's
//                 shared memory (no segment)
//   kill_pair     2 ranks, all-reduces of 4 MiB through the segment
//   kill_reader   rank 1 takes a single-copy descriptor from rank 0 and is
//                 killed before acknowledging; rank 0's send must fail
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/ucx_transport.h"

namespace {

using troupe::comm::chunk_range;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

float value(int rank, std::size_t i) {
  return static_cast<float>((rank * 7 + static_cast<int>(i % 13)) % 11 - 5);
}

int fail(int rank, const std::string& what) {
  std::printf("rank %d: FAILED %s\n", rank, what.c_str());
  std::fflush(stdout);
  return 1;
}

// Values whose sums depend on their order (magnitudes 2^-10 to 2^10).
std::vector<float> unordered_values(int rank, std::size_t n) {
  std::mt19937 gen(static_cast<unsigned>(rank + 1));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = std::ldexp(u(gen), static_cast<int>(gen() % 21) - 10);
  return x;
}

int collectives(int rank, int size, troupe::comm::UcxTransport& t) {
  std::uint64_t through_shared_memory = 0;
  // Twice: all-reduce by ring with every message of 64 KiB or more by single
  // copy, then (p a power of two) by halving/doubling with, of two ranks, the
  // all-reduces up to 1 MiB by copies and the larger by single copy
  // (CommunicatorOptions::copies_max_bytes). Where the ranks share this
  // host's memory, `c`'s all-reduces go through a shared memory segment
  // instead (`by_messages`' never do).
  for (std::size_t halving_max : {std::size_t{0}, ~std::size_t{0}}) {
    troupe::comm::Communicator c(t,
                                 [&] {
                                   std::vector<int> r(static_cast<std::size_t>(size));
                                   for (int i = 0; i < size; i++)
                                     r[static_cast<std::size_t>(i)] = i;
                                   return r;
                                 }(),
                                 troupe::comm::GroupKind::kWorld,
                                 {.slice_bytes = 64 << 10,
                                  .direct_max_bytes = 4 << 10,
                                  .halving_max_bytes = halving_max,
                                  .copies_max_bytes = halving_max == 0 ? 0 : std::size_t{1} << 20});
    // The same group's all-reduce with its bytes in messages: the reference
    // for the sums' bits.
    troupe::comm::Communicator by_messages(
        t, c.ranks(), troupe::comm::GroupKind::kTest,
        {.slice_bytes = 64 << 10,
         .direct_max_bytes = 4 << 10,
         .halving_max_bytes = halving_max,
         .copies_max_bytes = halving_max == 0 ? 0 : std::size_t{1} << 20,
         .shared_memory = false});
    for (std::size_t n : {0ul, 1ul, 7ul, 1000ul, 100003ul, 600001ul}) {
      std::vector<float> mine = unordered_values(rank, n), theirs = mine;
      absl::Status sa = c.all_reduce_sync(mine.data(), n),
                   sb = by_messages.all_reduce_sync(theirs.data(), n);
      if (!sa.ok() || !sb.ok())
        return fail(rank, "all_reduce: " + std::string((sa.ok() ? sb : sa).message()));
      if (n > 0 && std::memcmp(mine.data(), theirs.data(), n * sizeof(float)) != 0) {
        return fail(rank, "all_reduce of " + std::to_string(n) + ": other bits than by messages");
      }
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; i++) x[i] = value(rank, i);
      absl::Status st = c.all_reduce_sync(x.data(), n);
      if (!st.ok()) return fail(rank, "all_reduce: " + std::string(st.message()));
      for (std::size_t i = 0; i < n; i++) {
        float want = 0;
        for (int j = 0; j < size; j++) want += value(j, i);
        if (x[i] != want) return fail(rank, "all_reduce value at " + std::to_string(i));
      }
      for (std::size_t i = 0; i < n; i++) x[i] = value(rank, i);
      auto [b, e] = chunk_range(n, size, rank);
      std::vector<float> part(e - b);
      st = c.reduce_scatter_sync(x.data(), part.data(), n);
      if (!st.ok()) return fail(rank, "reduce_scatter: " + std::string(st.message()));
      for (std::size_t i = b; i < e; i++) {
        float want = 0;
        for (int j = 0; j < size; j++) want += value(j, i);
        if (part[i - b] != want) return fail(rank, "reduce_scatter value");
      }
      for (std::size_t i = b; i < e; i++) part[i - b] = static_cast<float>(i);
      std::vector<float> all(n, -1.0f);
      st = c.all_gather_sync(part.data(), all.data(), n);
      if (!st.ok()) return fail(rank, "all_gather: " + std::string(st.message()));
      for (std::size_t i = 0; i < n; i++)
        if (all[i] != static_cast<float>(i)) return fail(rank, "all_gather value");
      const int root = static_cast<int>(n % static_cast<std::size_t>(size));
      std::vector<float> y(n, rank == root ? 3.5f : 0.0f);
      st = c.broadcast_sync(y.data(), n, root);
      if (!st.ok()) return fail(rank, "broadcast: " + std::string(st.message()));
      for (float v : y)
        if (v != 3.5f) return fail(rank, "broadcast value");
    }
    if (by_messages.shared_memory_all_reduces() != 0) return fail(rank, "shared memory used");
    through_shared_memory += c.shared_memory_all_reduces();
  }
  std::printf("rank %d: single-copy bytes %llu\n", rank,
              static_cast<unsigned long long>(t.single_copy_bytes()));
  std::printf("rank %d: shared-memory all-reduces %llu\n", rank,
              static_cast<unsigned long long>(through_shared_memory));
  std::printf("rank %d: ok\n", rank);
  return 0;
}

// All-reduces of `floats` (16 MiB: through shared memory or by single copy;
// of two ranks 1 MiB by copies, 4 MiB through shared memory) until the
// victim dies, 300 ms after its first (so the group's way is set up: a
// sanitizer's slow start would otherwise kill it in the setup).
int kill_scenario(int rank, int size, int victim, std::size_t floats, bool shared_memory,
                  troupe::comm::Transport& t, troupe::comm::Bootstrap& b) {
  std::vector<int> ranks(static_cast<std::size_t>(size));
  for (int i = 0; i < size; i++) ranks[static_cast<std::size_t>(i)] = i;
  // Never destroyed: the watch may call it until the process's _Exit.
  auto* c = new troupe::comm::Communicator(t, ranks, troupe::comm::GroupKind::kWorld,
                                           {.shared_memory = shared_memory});
  b.watch([&t, c, rank](int dead, absl::Status why) {
    std::printf("rank %d: told at %.6f: %s\n", rank, now_s(), std::string(why.message()).c_str());
    std::fflush(stdout);
    t.fail_peer(dead, why);
    if (c->contains(dead)) c->fail(why);
  });
  std::vector<float> x(floats, 1.0f);
  for (int iter = 0; iter < 100000; iter++) {
    absl::Status st = c->all_reduce_sync(x.data(), x.size());
    if (!st.ok()) {
      std::printf("rank %d: shared-memory all-reduces %llu\n", rank,
                  static_cast<unsigned long long>(c->shared_memory_all_reduces()));
      std::printf("rank %d: error at %.6f: %s\n", rank, now_s(), std::string(st.message()).c_str());
      std::fflush(stdout);
      // Stay a moment: leaving now would look like a second death to ranks
      // that have not yet had their error.
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return st.message().find("rank " + std::to_string(victim)) != std::string_view::npos ? 0 : 1;
    }
    if (rank == victim && iter == 0) {
      std::thread([rank] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::printf("rank %d: killing myself at %.6f\n", rank, now_s());
        std::fflush(stdout);
        ::raise(SIGKILL);
      }).detach();
    }
  }
  return fail(rank, "no error although a rank died");
}

// Rank 0 sends one single-copy message to rank 1 as the runtime does (a
// plain send, no cancel token); rank 1 takes the descriptor and is killed
// before it acknowledges. Rank 0's send must end with an error naming rank
// 1 (the liveness check fails the peer), not wait for ever.
int kill_reader_scenario(int rank, troupe::comm::Transport& t, troupe::comm::Bootstrap& b) {
  b.watch([&](int dead, absl::Status why) { t.fail_peer(dead, why); });
  std::vector<float> x(1u << 18, 2.0f);  // 1 MiB
  if (rank == 1) {
    std::promise<void> got;
    t.recv_pull(0, 77, x.size() * 4, x.data(), [&](troupe::comm::Arrival a) {
      std::printf("rank 1: descriptor %s; killing myself at %.6f\n",
                  a.status().ok() ? "arrived" : "failed", now_s());
      std::fflush(stdout);
      ::raise(SIGKILL);
    });
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return fail(rank, "still alive");
  }
  std::promise<absl::Status> sent;
  auto f = sent.get_future();
  t.send(1, 77, x.data(), x.size() * 4, [&](absl::Status st) { sent.set_value(st); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready)
    return fail(rank, "the send never completed");
  absl::Status st = f.get();
  std::printf("rank 0: error at %.6f: %s\n", now_s(), std::string(st.message()).c_str());
  return !st.ok() && st.message().find("rank 1") != std::string_view::npos ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"one rank of a multi-process UCX test"};
  int rank = -1, size = 0, port = 0, victim = -1;
  std::string scenario = "collectives";
  app.add_option("--rank", rank)->required();
  app.add_option("--size", size)->required();
  app.add_option("--port", port)->required();
  app.add_option("--scenario", scenario)
      ->check(CLI::IsMember(
          {"collectives", "kill", "kill_messages", "kill_copies", "kill_pair", "kill_reader"}));
  app.add_option("--victim", victim);
  CLI11_PARSE(app, argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto w = troupe::comm::connect_ucx(rank, size, "127.0.0.1", port, absl::Seconds(60));
  if (!w.ok()) return fail(rank, std::string(w.status().message()));
  troupe::comm::UcxTransport& t = *w->transport;
  int rc = scenario == "kill" ? kill_scenario(rank, size, victim, 4u << 20, true, t, *w->bootstrap)
           : scenario == "kill_messages"
               ? kill_scenario(rank, size, victim, 4u << 20, false, t, *w->bootstrap)
           : scenario == "kill_copies"
               ? kill_scenario(rank, size, victim, 1u << 18, false, t, *w->bootstrap)
           : scenario == "kill_pair"
               ? kill_scenario(rank, size, victim, 1u << 20, true, t, *w->bootstrap)
           : scenario == "kill_reader" ? kill_reader_scenario(rank, t, *w->bootstrap)
                                       : collectives(rank, size, t);
  if (scenario != "collectives") {
    std::fflush(stdout);
    std::_Exit(rc);  // a rank died: skip the orderly teardown of UCX
  }
  absl::Status st = w->bootstrap->finish();
  if (!st.ok() && rc == 0) return fail(rank, std::string(st.message()));
  return rc;
}
