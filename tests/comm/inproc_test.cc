// The in-process fabric's matching tables stay bounded: tags carry step and
// sequence numbers, so an entry per (peer, tag) that outlived its message
// would grow the tables with every step (and fail_where scans them all under
// the lock).
#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/inproc_transport.h"

namespace troupe::comm {
namespace {

TEST(InProcTables, LongRunKeepsThemBounded) {
  const int p = 4;
  auto fabric = std::make_shared<InProcFabric>(p);
  std::vector<std::unique_ptr<Transport>> ts;
  for (int r = 0; r < p; r++) ts.push_back(fabric->endpoint(r));
  std::vector<int> ranks = {0, 1, 2, 3};
  std::vector<std::thread> threads;
  const int steps = 300;
  for (int r = 0; r < p; r++) {
    threads.emplace_back([&, r] {
      Communicator c(*ts[static_cast<std::size_t>(r)], ranks, GroupKind::kTest,
                     {.slice_bytes = 256, .direct_max_bytes = 64});
      std::vector<float> x(1000, 1.0f);
      for (int step = 0; step < steps; step++) {
        ASSERT_TRUE(c.all_reduce_sync(x.data(), x.size()).ok());
        std::fill(x.begin(), x.end(), 1.0f);
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every message was matched: nothing waits, so no entry may be left (each
  // step used new tags: 300 steps x 4 ranks x several slices of entries
  // without the erase).
  EXPECT_EQ(fabric->pending_entries(), 0u);
}

TEST(InProcTables, SendsPostedFirstAndFailedOnesLeaveNoEntry) {
  auto fabric = std::make_shared<InProcFabric>(2);
  auto t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
  std::vector<float> a(16, 1.0f), b(16, 0.0f);
  std::atomic<int> done{0};
  for (Tag tag = 1; tag <= 100; tag++) {  // send first, then its receive
    t0->send(1, tag, a.data(), 64, [&](absl::Status st) { done += st.ok(); });
    t1->recv(0, tag, b.data(), 64, [&](absl::Status st) { done += st.ok(); });
  }
  while (done.load() < 200) std::this_thread::yield();
  EXPECT_EQ(fabric->pending_entries(), 0u);
  // Pending receives failed by a dead peer leave nothing behind either.
  std::atomic<int> failed{0};
  for (Tag tag = 101; tag <= 150; tag++)
    t1->recv(0, tag, b.data(), 64, [&](absl::Status st) { failed += !st.ok(); });
  EXPECT_EQ(fabric->pending_entries(), 50u);
  t1->fail_peer(0, absl::UnavailableError("rank 0 died"));
  while (failed.load() < 50) std::this_thread::yield();
  EXPECT_EQ(fabric->pending_entries(), 0u);
}

// A completion callback that throws -- run by the fabric's queue, or inline
// on the thread of the peer's matching call -- does not end the process:
// every later operation fails with the error.
TEST(InProcCallbacks, OneThatThrowsFailsTheFabricNotTheProcess) {
  for (bool inline_completion : {false, true}) {
    auto fabric = std::make_shared<InProcFabric>(2);
    auto t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
    float a = 1, b = 0;
    auto bad = [](absl::Status) { throw std::runtime_error("bug in a callback"); };
    if (inline_completion) {  // the receive waits; the send's call completes it
      t1->recv(0, 1, &b, 4, bad);
      t0->send(1, 1, &a, 4, [](absl::Status) {});
    } else {  // the send waits; the receive is the poster, completed by the queue
      t0->send(1, 1, &a, 4, [](absl::Status) {});
      t1->recv(0, 1, &b, 4, bad);
    }
    std::promise<absl::Status> later;
    auto f = later.get_future();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t1->recv(0, 2, &b, 4, [&](absl::Status st) { later.set_value(st); });
    ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    absl::Status st = f.get();
    EXPECT_TRUE(absl::IsInternal(st)) << inline_completion << ": " << st;
    EXPECT_NE(st.message().find("bug in a callback"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace troupe::comm
