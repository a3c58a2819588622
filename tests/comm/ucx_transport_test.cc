// The UCX transport within one process: two transports (ranks 0 and 1)
// connected to each other. Same host and pid, so large messages take the
// single-copy protocol (process_vm_readv of this process's own memory).
// Each case is a failure path that once lost a completion.
#include "comm/ucx_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/trace.h"
#include "comm/traced_transport.h"

namespace troupe::comm {
namespace {

struct Pair {
  std::unique_ptr<UcxTransport> t[2];
};

Pair connected_pair() {
  Pair p;
  for (int r = 0; r < 2; r++) {
    auto t = UcxTransport::create(r, 2);
    EXPECT_TRUE(t.ok()) << t.status();
    p.t[r] = std::move(*t);
  }
  const std::vector<std::string> addresses = {p.t[0]->address(), p.t[1]->address()};
  for (auto& t : p.t) EXPECT_TRUE(t->connect(addresses).ok());
  return p;
}

// Through the interface, as the runtime calls it (default arguments).
Transport& at(Pair& p, int r) { return *p.t[r]; }

// A status that arrives within `within`, or DeadlineExceeded ("never").
absl::Status await(std::future<absl::Status>& f, std::chrono::seconds within) {
  if (f.wait_for(within) != std::future_status::ready)
    return absl::DeadlineExceededError("the callback never ran");
  return f.get();
}

// Large enough for the single-copy protocol.
constexpr std::size_t kBig = 4 * UcxTransport::kSingleCopyMin;

bool single_copy_here() {
  auto p = connected_pair();
  std::vector<char> a(kBig, 'x'), b(kBig, 0);
  std::promise<absl::Status> s, r;
  at(p, 1).recv(0, 5, b.data(), kBig, [&](absl::Status st) { r.set_value(st); });
  at(p, 0).send(1, 5, a.data(), kBig, [&](absl::Status st) { s.set_value(st); });
  auto rf = r.get_future(), sf = s.get_future();
  EXPECT_TRUE(await(rf, std::chrono::seconds(10)).ok());
  EXPECT_TRUE(await(sf, std::chrono::seconds(10)).ok());
  return p.t[1]->single_copy_bytes() > 0;
}

class UcxSingleCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!single_copy_here())
      GTEST_SKIP() << "this host does not let a process read memory by process_vm_readv "
                      "(or TROUPE_SINGLE_COPY=0): the single-copy protocol is off";
  }
};

// The descriptor cannot be sent: the send fails (it once waited for ever for
// an acknowledgement that could not come), and its acknowledgement's
// receive is given up (nothing stays pending).
TEST_F(UcxSingleCopy, DescriptorSendFailureFailsTheSend) {
  auto p = connected_pair();
  std::vector<char> a(kBig, 'x');
  p.t[0]->inject_fault_for_test(UcxTransport::Fault::kCopyDescriptorSend);
  std::promise<absl::Status> sent;
  auto f = sent.get_future();
  at(p, 0).send(1, 9, a.data(), kBig, [&](absl::Status st) { sent.set_value(st); });
  absl::Status st = await(f, std::chrono::seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("descriptor was not sent"), std::string::npos) << st;
  for (int i = 0; i < 1000 && p.t[0]->pending_operations() > 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(p.t[0]->pending_operations(), 0u) << "the acknowledgement's receive was left posted";
}

// The acknowledgement cannot be sent: the receiver's data is there, and the
// receiver marks the sender failed, so its operations with that rank fail
// (its owner's supervision then stops the job, which frees the sender).
TEST_F(UcxSingleCopy, AckSendFailureFailsThePeerOnTheReceiver) {
  auto p = connected_pair();
  std::vector<char> a(kBig), b(kBig, 0);
  for (std::size_t i = 0; i < kBig; i++) a[i] = static_cast<char>(i * 7);
  p.t[1]->inject_fault_for_test(UcxTransport::Fault::kCopyAckSend);
  std::promise<absl::Status> received, later;
  auto rf = received.get_future(), lf = later.get_future();
  at(p, 1).recv(0, 3, b.data(), kBig, [&](absl::Status st) { received.set_value(st); });
  at(p, 0).send(1, 3, a.data(), kBig, [](absl::Status) {});
  ASSERT_TRUE(await(rf, std::chrono::seconds(10)).ok());
  EXPECT_EQ(a, b);
  char small = 0;
  at(p, 1).recv(0, 4, &small, 1, [&](absl::Status st) { later.set_value(st); });
  absl::Status st = await(lf, std::chrono::seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("acknowledgement failed"), std::string::npos) << st;
  // What the job's supervision would do on the sender's side.
  p.t[0]->fail_peer(1, absl::UnavailableError("rank 1 stopped"));
}

// A plain receive by single copy is read off the progress thread (it once
// read the whole message inside UCX's completion there, stalling every
// other operation): its callback runs on another thread than that of a
// small message completed by the progress thread.
TEST_F(UcxSingleCopy, PlainReceiveIsNotReadOnTheProgressThread) {
  auto p = connected_pair();
  std::vector<char> a(kBig, 'y'), b(kBig, 0);
  char sa = 1, sb = 0;
  std::promise<std::thread::id> small_on, big_on;
  at(p, 1).recv(0, 1, &sb, 1,
                [&](absl::Status) { small_on.set_value(std::this_thread::get_id()); });
  at(p, 0).send(1, 1, &sa, 1, [](absl::Status) {});
  const std::thread::id progress = small_on.get_future().get();
  at(p, 1).recv(0, 2, b.data(), kBig,
                [&](absl::Status) { big_on.set_value(std::this_thread::get_id()); });
  at(p, 0).send(1, 2, a.data(), kBig, [](absl::Status) {});
  EXPECT_NE(big_on.get_future().get(), progress);
  EXPECT_EQ(a, b);
}

// A receive too small for a message sent by single copy fails, and so does
// the send (it once waited for ever for an acknowledgement: the receiver
// took the descriptor as a too-long message and never answered).
TEST_F(UcxSingleCopy, SizeMismatchFailsBothSides) {
  auto p = connected_pair();
  std::vector<char> a(kBig, 'x'), b(100);
  std::promise<absl::Status> r, s;
  auto rf = r.get_future(), sf = s.get_future();
  at(p, 1).recv(0, 31, b.data(), b.size(), [&](absl::Status st) { r.set_value(st); });
  at(p, 0).send(1, 31, a.data(), kBig, [&](absl::Status st) { s.set_value(st); });
  EXPECT_TRUE(absl::IsInvalidArgument(await(rf, std::chrono::seconds(10))));
  absl::Status st = await(sf, std::chrono::seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("could not copy"), std::string::npos) << st;
}

// A cancelled single-copy send whose descriptor has been delivered waits
// for the receiver's acknowledgement (the receiver may be reading its
// buffer); it once gave up at once when the cancel failed the descriptor's
// send, and the caller could reuse a buffer still being read.
TEST_F(UcxSingleCopy, CancelledSendWaitsForTheReceiversAcknowledgement) {
  auto p = connected_pair();
  std::vector<char> a(kBig, 'c');
  auto token = std::make_shared<CancelToken>();
  std::promise<absl::Status> s;
  std::promise<Arrival> got;
  auto sf = s.get_future();
  at(p, 1).recv_pull(0, 41, kBig, nullptr, [&](Arrival m) { got.set_value(std::move(m)); });
  at(p, 0).send(
      1, 41, a.data(), kBig, [&](absl::Status st) { s.set_value(st); }, token);
  Arrival m = got.get_future().get();  // the receiver holds the descriptor, not yet read
  ASSERT_TRUE(m.status().ok()) << m.status();
  p.t[0]->cancel(token, absl::CancelledError("the collective was aborted"));
  EXPECT_EQ(sf.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "the send completed while the receiver could still read its buffer";
  std::vector<char> b(kBig);
  ASSERT_TRUE(m.read(0, b.data(), kBig).ok());
  m.release();
  EXPECT_EQ(await(sf, std::chrono::seconds(5)).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(a, b);
}

// The bytes read by single copy are counted per peer, and describe_lanes()
// (the multihost test reads it from every worker's log) names each peer's
// UCX transports and its single-copy state and bytes: after one message
// from rank 0, rank 1 has read kBig bytes from rank 0 and none from itself.
TEST_F(UcxSingleCopy, BytesAreCountedPerPeerAndDescribed) {
  auto p = connected_pair();
  std::vector<char> a(kBig, 'z'), b(kBig, 0);
  std::promise<absl::Status> received;
  auto rf = received.get_future();
  at(p, 1).recv(0, 6, b.data(), kBig, [&](absl::Status st) { received.set_value(st); });
  at(p, 0).send(1, 6, a.data(), kBig, [](absl::Status) {});
  ASSERT_TRUE(await(rf, std::chrono::seconds(10)).ok());
  EXPECT_EQ(p.t[1]->single_copy_bytes_from(0), kBig);
  EXPECT_EQ(p.t[1]->single_copy_bytes_from(1), 0u);
  EXPECT_EQ(p.t[0]->single_copy_bytes_from(1), 0u);
  EXPECT_EQ(p.t[1]->single_copy_bytes_from(2), 0u);  // no such rank
  const std::string lanes = p.t[1]->describe_lanes();
  const std::string want_0 = "rank 0: ";
  const std::string want_copy = " (single copy on, " + std::to_string(kBig) + " bytes); rank 1: ";
  ASSERT_EQ(lanes.rfind(want_0, 0), 0u) << lanes;
  const std::size_t copy = lanes.find(want_copy);
  ASSERT_NE(copy, std::string::npos) << lanes;
  // Between them, UCX's transport/device names (e.g. "sysv/memory tcp/lo").
  const std::string to_0 = lanes.substr(want_0.size(), copy - want_0.size());
  EXPECT_NE(to_0.find('/'), std::string::npos) << lanes;
  EXPECT_EQ(to_0.find('?'), std::string::npos) << lanes;
  EXPECT_EQ(lanes.find("single copy", copy + want_copy.size()), std::string::npos)
      << "rank 1's own entry says nothing of single copy: " << lanes;
}

// A caller posts its own operation to UCX (no hop through the progress
// thread), yet its completion never runs inside the call that posted it,
// even where UCX completes it inside the post: a receive of a message that
// has already come, a small send. Many rounds, both orders.
TEST(UcxTransportLifetime, ACompletionNeverRunsInsideThePostingCall) {
  auto p = connected_pair();
  thread_local bool posting = false;
  std::atomic<int> inside{0}, done{0};
  auto check = [&](absl::Status st) {
    EXPECT_TRUE(st.ok()) << st;
    if (posting) inside++;
    done++;
  };
  auto post = [&](auto&& call) {
    posting = true;
    call();
    posting = false;
  };
  constexpr int kRounds = 200;
  std::vector<char> a(4096, 'q'), b(4096);
  for (int i = 0; i < kRounds; i++) {
    const Tag tag = 100 + static_cast<Tag>(i);
    if (i % 2 == 0) {
      post([&] { at(p, 0).send(1, tag, a.data(), a.size(), check); });
      // It has come, and rank 1's worker has taken it in (unexpected).
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      for (int k = 0; k < 3; k++) p.t[1]->poll();
      post([&] { at(p, 1).recv(0, tag, b.data(), b.size(), check); });
    } else {
      post([&] { at(p, 1).recv(0, tag, b.data(), b.size(), check); });
      post([&] { at(p, 0).send(1, tag, a.data(), a.size(), check); });
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (done.load() < 2 * (i + 1) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    ASSERT_EQ(done.load(), 2 * (i + 1)) << "a completion never came, round " << i;
  }
  EXPECT_EQ(inside.load(), 0);
  EXPECT_EQ(b[4095], 'q');
}

// Destroying a transport completes every pending operation (they were once
// dropped, their callbacks never run).
TEST(UcxTransportLifetime, DestructionCompletesPendingOperations) {
  auto p = connected_pair();
  std::vector<char> a(kBig, 'z'), b(16);
  std::promise<absl::Status> r, s, r2;
  auto rf = r.get_future(), sf = s.get_future(), r2f = r2.get_future();
  at(p, 0).recv(1, 11, b.data(), b.size(), [&](absl::Status st) { r.set_value(st); });
  at(p, 0).recv_pull(1, 12, kBig, nullptr, [&](Arrival m) { r2.set_value(m.status()); });
  at(p, 0).send(1, 13, a.data(), kBig,
                [&](absl::Status st) { s.set_value(st); });  // never received
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  p.t[0].reset();
  for (auto* f : {&rf, &sf, &r2f}) {
    absl::Status st = await(*f, std::chrono::seconds(1));
    EXPECT_TRUE(absl::IsAborted(st)) << st;
  }
}

// Destroyed while a plain single-copy receive is being read or its
// descriptor is arriving: the receive completes once (read, or Aborted), and
// nothing touches the copy thread after it is gone (the progress thread once
// could, during the destructor).
TEST(UcxTransportLifetime, DestructionWithASingleCopyReceiveInFlight) {
  for (int delay_us : {0, 50, 200, 1000}) {
    auto p = connected_pair();
    std::vector<char> a(kBig, 'q'), b(kBig);
    std::atomic<int> calls{0};
    std::promise<absl::Status> s;
    auto sf = s.get_future();
    at(p, 0).recv(1, 51, b.data(), kBig, [&](absl::Status st) {
      calls++;
      EXPECT_TRUE(st.ok() || absl::IsAborted(st)) << st;
    });
    at(p, 1).send(0, 51, a.data(), kBig, [&](absl::Status st) { s.set_value(st); });
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    p.t[0].reset();
    EXPECT_LE(calls.load(), 1);
    p.t[1]->fail_peer(0, absl::UnavailableError("rank 0 left"));  // what liveness would say
    EXPECT_NE(await(sf, std::chrono::seconds(5)).code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(calls.load(), 1) << "the receive never completed (delay " << delay_us << " us)";
  }
}

// A completion callback that throws: the process goes on, and the error
// reaches the transport's other operations instead of std::terminate.
TEST(UcxTransportLifetime, CallbackThatThrowsFailsTheTransportNotTheProcess) {
  auto p = connected_pair();
  char x = 1, y = 0, z = 0;
  at(p, 1).recv(0, 21, &y, 1, [](absl::Status) { throw std::runtime_error("bug in a callback"); });
  at(p, 0).send(1, 21, &x, 1, [](absl::Status) {});
  std::promise<absl::Status> next;
  auto nf = next.get_future();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  at(p, 1).recv(0, 22, &z, 1, [&](absl::Status st) { next.set_value(st); });
  absl::Status st = await(nf, std::chrono::seconds(10));
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_NE(st.message().find("bug in a callback"), std::string::npos) << st;
}

// Every rank on one host (UcxOptions::one_host): UCX without TCP carries
// small and single-copy messages alike, and its lanes name no tcp device.
TEST(UcxOneHost, ShortAndSingleCopyMessagesGoWithoutTcp) {
  Pair p;
  for (int r = 0; r < 2; r++) {
    auto t = UcxTransport::create(r, 2, {.one_host = true});
    ASSERT_TRUE(t.ok()) << t.status();
    p.t[r] = std::move(*t);
  }
  const std::vector<std::string> addresses = {p.t[0]->address(), p.t[1]->address()};
  for (auto& t : p.t) ASSERT_TRUE(t->connect(addresses).ok());
  for (const std::size_t bytes : {std::size_t{8}, kBig}) {
    std::vector<char> a(bytes, 'q'), b(bytes, 0);
    std::promise<absl::Status> s, r;
    at(p, 1).recv(0, 31, b.data(), bytes, [&](absl::Status st) { r.set_value(st); });
    at(p, 0).send(1, 31, a.data(), bytes, [&](absl::Status st) { s.set_value(st); });
    auto rf = r.get_future(), sf = s.get_future();
    EXPECT_TRUE(await(rf, std::chrono::seconds(10)).ok()) << bytes;
    EXPECT_TRUE(await(sf, std::chrono::seconds(10)).ok()) << bytes;
    EXPECT_EQ(a, b) << bytes;
  }
  if (std::getenv("UCX_TLS") == nullptr) {
    EXPECT_EQ(p.t[0]->describe_lanes().find("tcp"), std::string::npos) << p.t[0]->describe_lanes();
  }
  if (single_copy_here()) {
    EXPECT_GT(p.t[1]->single_copy_bytes(), 0u);
  }
}

// A peer whose address names another host is refused by name: without TCP
// it could not be reached (a launcher that said every rank was here was
// wrong).
TEST(UcxOneHost, APeerOnAnotherHostIsRefusedNamingIt) {
  if (std::getenv("UCX_TLS") != nullptr)
    GTEST_SKIP() << "UCX_TLS is set: it stands, with TCP if it says so, and nothing is refused";
  auto t0 = UcxTransport::create(0, 2, {.one_host = true});
  auto t1 = UcxTransport::create(1, 2);
  ASSERT_TRUE(t0.ok() && t1.ok());
  // Address: pid (4 bytes), the place's length (2), the place ("HOST
  // pidns=N cma"), UCX's address. Rank 1's, moved to host "elsewhere".
  std::string a = (*t1)->address();
  std::uint16_t len = 0;
  std::memcpy(&len, a.data() + 4, 2);
  std::string place = a.substr(6, len);
  place = "elsewhere" + place.substr(place.rfind(" pidns="));
  const auto moved_len = static_cast<std::uint16_t>(place.size());
  std::string moved = a.substr(0, 4);
  moved.append(reinterpret_cast<const char*>(&moved_len), 2);
  moved += place + a.substr(6 + len);
  absl::Status st = (*t0)->connect({(*t0)->address(), moved});
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("rank 1 is on host elsewhere"), std::string::npos) << st;
  EXPECT_NE(st.message().find("comm::UcxOptions::one_host"), std::string::npos) << st;
}

// Route::kCopies moves even a large message by copies through shared memory:
// the bytes arrive, by a plain receive and by a pulled one (into its landing
// buffer), and none are read by the single-copy protocol. The receiving
// side is wrapped in a TracedTransport, as the runtime's ranks are, which
// must pass the route on.
TEST_F(UcxSingleCopy, RouteCopiesTakesNoSingleCopy) {
  auto p = connected_pair();
  trace::Recorder recorder(64);
  UcxTransport* receiver = p.t[1].get();
  TracedTransport traced(std::move(p.t[1]), &recorder);
  Transport& t1 = traced;
  std::vector<char> a(kBig, 'c'), b(kBig, 0), c(kBig, 0);
  std::promise<absl::Status> sent[2], received[2];
  t1.recv(
      0, 41, b.data(), kBig, [&](absl::Status st) { received[0].set_value(st); }, nullptr,
      Route::kCopies);
  const void* landed = nullptr;
  t1.recv_pull(
      0, 42, kBig, c.data(),
      [&](Arrival m) {
        const absl::Status st = m.status();
        landed = m.data();
        m.release(st);
        received[1].set_value(st);
      },
      nullptr, Route::kCopies);
  for (int i = 0; i < 2; i++) {
    at(p, 0).send(
        1, 41 + i, a.data(), kBig, [&, i](absl::Status st) { sent[i].set_value(st); }, nullptr,
        Route::kCopies);
  }
  for (int i = 0; i < 2; i++) {
    auto rf = received[i].get_future(), sf = sent[i].get_future();
    EXPECT_TRUE(await(rf, std::chrono::seconds(10)).ok()) << i;
    EXPECT_TRUE(await(sf, std::chrono::seconds(10)).ok()) << i;
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(landed, c.data());
  EXPECT_EQ(a, c);
  EXPECT_EQ(receiver->single_copy_bytes(), 0u);
}

// A communicator's all-reduce up to copies_max_bytes goes by copies, a
// larger one by single copy, on both members; both sum right (each member
// adds 1 + rank). (By messages: with `shared_memory`, two transports of one
// host all-reduce through a segment.)
TEST_F(UcxSingleCopy, SmallCollectivesGoByCopiesLargeOnesBySingleCopy) {
  auto p = connected_pair();
  CommunicatorOptions options;
  options.copies_max_bytes = 1 << 20;
  options.shared_memory = false;
  for (const std::size_t n : {std::size_t{1} << 18, std::size_t{1} << 19}) {  // 1 and 2 MiB
    const std::uint64_t before[2] = {p.t[0]->single_copy_bytes(), p.t[1]->single_copy_bytes()};
    std::vector<float> data[2];
    std::future<absl::Status> done[2];
    for (int r = 0; r < 2; r++) {
      data[r].assign(n, 1.0f + static_cast<float>(r));
      done[r] = std::async(std::launch::async, [&, r] {
        Communicator c(*p.t[r], {0, 1}, GroupKind::kData, options);
        return c.all_reduce_sync(data[r].data(), n);
      });
    }
    absl::Status st[2];
    for (int r = 0; r < 2; r++) st[r] = await(done[r], std::chrono::seconds(20));
    for (int r = 0; r < 2; r++) {
      ASSERT_TRUE(st[r].ok()) << n << ": " << st[r];
      EXPECT_EQ(data[r], std::vector<float>(n, 3.0f)) << n;
      if (n * sizeof(float) <= options.copies_max_bytes) {
        EXPECT_EQ(p.t[r]->single_copy_bytes(), before[r]) << n;
      } else {
        EXPECT_GT(p.t[r]->single_copy_bytes(), before[r]) << n;
      }
    }
  }
}

}  // namespace
}  // namespace troupe::comm
