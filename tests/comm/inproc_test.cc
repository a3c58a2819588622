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

// A thread that drives its rank gets the completions of what it posted in
// its own poll(), never inside the posting call; what another thread of the
// same rank posted completes as before (inline on the matching peer's
// thread), and the last drive_end() runs what is left.
TEST(InProcDrive, ADriversOwnCompletionsRunInItsPollAndNowhereElse) {
  auto fabric = std::make_shared<InProcFabric>(2);
  auto t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
  ASSERT_TRUE(t0->can_poll());
  float a = 1, b = 0, c = 2, d = 0;
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id sent_on, other_on;
  bool in_call = false, ran_in_call = false;
  bool received = false;
  t1->recv(0, 1, &b, 4, [&](absl::Status st) { received = st.ok(); });  // waiting: completed inline
  DriveScope drive(t0.get());
  in_call = true;
  t0->send(1, 1, &a, 4, [&](absl::Status st) {
    ran_in_call = in_call;
    if (st.ok()) sent_on = std::this_thread::get_id();
  });
  in_call = false;
  EXPECT_TRUE(received);  // the peer's receive, inline in this call
  EXPECT_EQ(b, 1.0f);
  EXPECT_EQ(sent_on, std::thread::id());  // held for this thread's poll
  // Another thread of rank 0 posts a receive; rank 1's send completes it.
  std::promise<void> other_done;
  std::thread other([&] {
    t0->recv(1, 2, &d, 4, [&](absl::Status) {
      other_on = std::this_thread::get_id();
      other_done.set_value();
    });
  });
  other.join();
  t1->send(0, 2, &c, 4, [](absl::Status) {});
  // Completed inside rank 1's matching send (on this thread), not held for
  // this thread's poll: it is not the driver's.
  ASSERT_EQ(other_done.get_future().wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(other_on, me);
  EXPECT_EQ(d, 2.0f);
  EXPECT_TRUE(t0->poll());
  EXPECT_EQ(sent_on, me);
  EXPECT_FALSE(ran_in_call);
  EXPECT_FALSE(t0->poll());  // nothing more
  // Posted, completed, not polled: drive_end runs it.
  std::thread::id left_on;
  t1->recv(0, 3, &b, 4, [](absl::Status) {});
  t0->send(1, 3, &a, 4, [&](absl::Status) { left_on = std::this_thread::get_id(); });
  EXPECT_EQ(left_on, std::thread::id());
  t0->drive_end();
  EXPECT_EQ(left_on, me);
  t0->drive_begin();  // (the scope's end)
}

// A driver asleep in wait_for_event() wakes when the peer's send completes
// its receive, well before the bound it slept with.
TEST(InProcDrive, ASleepingDriverWakesForItsCompletion) {
  auto fabric = std::make_shared<InProcFabric>(2);
  auto t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
  float a = 3, b = 0;
  DriveScope drive(t0.get());
  bool got = false;
  t0->recv(1, 1, &b, 4, [&](absl::Status st) { got = st.ok(); });
  std::thread peer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t1->send(0, 1, &a, 4, [](absl::Status) {});
  });
  const auto t_start = std::chrono::steady_clock::now();
  while (!got) {
    if (!t0->poll()) t0->wait_for_event(std::chrono::seconds(10));
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  peer.join();
  EXPECT_EQ(b, 3.0f);
  EXPECT_LT(s, 5.0);  // woken, not timed out
}

}  // namespace
}  // namespace troupe::comm
