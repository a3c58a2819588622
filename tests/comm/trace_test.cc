// The per-rank recorder (comm/trace.h) and the transport that records every
// message (comm/traced_transport.h). Expected values are worked out by hand
// from what each test does.
#include "comm/trace.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "comm/inproc_transport.h"
#include "comm/traced_transport.h"

namespace troupe::comm::trace {
namespace {

Event at(int step, std::int64_t b, std::int64_t e) {
  Event ev;
  ev.kind = Kind::kForward;
  ev.step = step;
  ev.begin_ns = b;
  ev.end_ns = e;
  return ev;
}

TEST(Recorder, KeepsTheNewestEventsOldestFirstAndCountsTheDropped) {
  Recorder rec(4);
  for (int i = 1; i <= 10; i++) rec.record(at(1, i, i + 1));
  const Recorder::Contents c = rec.contents();
  ASSERT_EQ(c.events.size(), 4u);
  // 10 recorded into 4 places: 7, 8, 9, 10 are left, 6 were overwritten.
  for (int i = 0; i < 4; i++) EXPECT_EQ(c.events[static_cast<std::size_t>(i)].begin_ns, 7 + i);
  EXPECT_EQ(c.recorded, 10u);
  EXPECT_EQ(c.dropped, 6u);
  EXPECT_EQ(c.capacity, 4u);
}

TEST(Recorder, AnOpenEventIsReportedOpenUntilClosedThenRecordedOnce) {
  Recorder rec(16);
  Event e;
  e.kind = Kind::kRecv;
  e.step = 2;
  e.peer = 5;
  const Recorder::Handle a = rec.open(e);
  const Recorder::Handle b = rec.open(e);
  EXPECT_NE(a, b);  // both open: distinct handles
  Recorder::Contents c = rec.contents();
  EXPECT_EQ(c.events.size(), 0u);
  ASSERT_EQ(c.open.size(), 2u);
  EXPECT_EQ(c.open[0].end_ns, 0);
  EXPECT_GT(c.open[0].begin_ns, 0);  // stamped by open()
  rec.close(a, /*failed=*/true);
  rec.close(a);  // a second close of a closed handle does nothing
  c = rec.contents();
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.open.size(), 1u);
  EXPECT_EQ(c.events[0].peer, 5);
  EXPECT_EQ(c.events[0].failed, 1);
  EXPECT_GE(c.events[0].end_ns, c.events[0].begin_ns);
  // The closed handle is free again; the open one is not reused.
  const Recorder::Handle d = rec.open(e);
  EXPECT_NE(d, b);
  rec.close(Recorder::kNone);  // nothing
  rec.close(b);
  rec.close(d);
  EXPECT_EQ(rec.contents().events.size(), 3u);
  EXPECT_TRUE(rec.contents().open.empty());
}

TEST(Recorder, AStepWindowKeepsItsStepsAndThoseOfNoStep) {
  Recorder rec(64);
  rec.set_steps(3, 4);
  for (int step = 0; step <= 6; step++) rec.record(at(step, step, step));
  Event e;
  e.step = 5;
  EXPECT_EQ(rec.open(e), Recorder::kNone);  // outside: not even opened
  const Recorder::Contents c = rec.contents();
  ASSERT_EQ(c.events.size(), 3u);  // steps 0, 3, 4
  EXPECT_EQ(c.events[0].step, 0);
  EXPECT_EQ(c.events[1].step, 3);
  EXPECT_EQ(c.events[2].step, 4);
}

TEST(Recorder, ManyThreadsLoseNothing) {
  Recorder rec(1 << 16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&rec, t] {
      for (int i = 0; i < 5000; i++) {
        Event e;
        e.kind = Kind::kSend;
        e.step = 1;
        e.peer = t;
        rec.close(rec.open(e));
      }
    });
  }
  for (auto& th : threads) th.join();
  const Recorder::Contents c = rec.contents();
  EXPECT_EQ(c.recorded, 20000u);
  EXPECT_EQ(c.events.size(), 20000u);
  EXPECT_TRUE(c.open.empty());
  int per[4] = {};
  for (const Event& e : c.events) per[e.peer]++;
  for (int n : per) EXPECT_EQ(n, 5000);
}

TEST(Recorder, MessageNamesComeFromTheTag) {
  EXPECT_STREQ(message_name(make_tag({.source = 1,
                                      .group = GroupKind::kPipeline,
                                      .kind = MessageKind::kActivation,
                                      .step = 3,
                                      .micro = 2,
                                      .chunk = 0,
                                      .layer = 0})),
               "activation");
  EXPECT_STREQ(message_name(make_tag({.source = 1,
                                      .group = GroupKind::kData,
                                      .kind = MessageKind::kParamSlice,
                                      .step = 3,
                                      .micro = 0,
                                      .chunk = 0,
                                      .layer = 1})),
               "param-piece");
  EXPECT_STREQ(message_name(collective_tag(1, GroupKind::kTensor, 7, 0, 0)), "tp");
  EXPECT_STREQ(message_name(collective_tag(1, GroupKind::kData, 7, 0, 0)), "collective");
}

// Two ranks over the in-process transport, each recording its own.
TEST(TracedTransport, ASendAndItsReceiveCarryTheSameTagPeerAndBytesOnBothSides) {
  auto fabric = std::make_shared<InProcFabric>(2);
  Recorder r0(64), r1(64);
  TracedTransport t0(fabric->endpoint(0), &r0), t1(fabric->endpoint(1), &r1);
  const Tag tag = make_tag({.source = 0,
                            .group = GroupKind::kPipeline,
                            .kind = MessageKind::kGradient,
                            .step = 4,
                            .micro = 3,
                            .chunk = 1,
                            .layer = 0});
  std::vector<float> out(8, 1.0f), in(8, 0.0f);
  std::promise<absl::Status> sent, got;
  t1.recv(0, tag, in.data(), in.size() * 4, [&](absl::Status st) { got.set_value(st); });
  // Posted, not matched yet: rank 1 shows an open receive.
  ASSERT_EQ(r1.contents().open.size(), 1u);
  t0.send(1, tag, out.data(), out.size() * 4, [&](absl::Status st) { sent.set_value(st); });
  ASSERT_TRUE(sent.get_future().get().ok());
  ASSERT_TRUE(got.get_future().get().ok());
  const Recorder::Contents c0 = r0.contents(), c1 = r1.contents();
  ASSERT_EQ(c0.events.size(), 1u);
  ASSERT_EQ(c1.events.size(), 1u);
  EXPECT_TRUE(c1.open.empty());
  const Event& s = c0.events[0];
  const Event& r = c1.events[0];
  EXPECT_EQ(s.kind, Kind::kSend);
  EXPECT_EQ(r.kind, Kind::kRecv);
  EXPECT_EQ(s.tag, tag);
  EXPECT_EQ(r.tag, tag);
  EXPECT_EQ(s.peer, 1);
  EXPECT_EQ(r.peer, 0);
  EXPECT_EQ(s.bytes, 32);
  EXPECT_EQ(r.bytes, 32);
  // From the tag: step 4, micro-batch 3, chunk 1.
  EXPECT_EQ(r.step, 4);
  EXPECT_EQ(r.micro, 3);
  EXPECT_EQ(r.chunk, 1);
  EXPECT_EQ(r.failed, 0);
  // The receive was posted before the send and completed after it was posted.
  EXPECT_LE(r.begin_ns, s.begin_ns);
  EXPECT_GE(r.end_ns, s.begin_ns);
}

TEST(TracedTransport, AReceiveThatFailsIsRecordedAsFailed) {
  auto fabric = std::make_shared<InProcFabric>(2);
  Recorder r1(64);
  TracedTransport t1(fabric->endpoint(1), &r1);
  std::vector<float> in(4);
  std::promise<absl::Status> got;
  t1.recv(0, 42, in.data(), 16, [&](absl::Status st) { got.set_value(st); });
  t1.fail_peer(0, absl::UnavailableError("rank 0 died"));
  EXPECT_FALSE(got.get_future().get().ok());
  const Recorder::Contents c = r1.contents();
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_EQ(c.events[0].failed, 1);
  EXPECT_TRUE(c.open.empty());
}

}  // namespace
}  // namespace troupe::comm::trace

namespace troupe::comm {
namespace {

TEST(TracedTransport, StepsPast65535AreRecordedWhole) {
  // A tag carries the step mod 2^16; the rank's step gives the rest.
  EXPECT_EQ(unwrap_step(70000 & 0xFFFF, 70000), 70000);
  EXPECT_EQ(unwrap_step(0, 65536), 65536);
  EXPECT_EQ(unwrap_step(65535, 65536), 65535);  // the previous step's late message
  EXPECT_EQ(unwrap_step(1, 65535), 65537);
  EXPECT_EQ(unwrap_step(3, 2), 3);
  EXPECT_EQ(unwrap_step(65535, 0), 0);  // never negative
  auto fabric = std::make_shared<InProcFabric>(2);
  trace::Recorder r0(16);
  r0.set_steps(70000, 70000);
  std::atomic<int> step{70000};
  TracedTransport t0(fabric->endpoint(0), &r0, &step);
  const Tag tag = make_tag({.source = 0,
                            .group = GroupKind::kPipeline,
                            .kind = MessageKind::kActivation,
                            .step = 70000,
                            .micro = 1,
                            .chunk = 0,
                            .layer = 0});
  std::vector<float> buf(4);
  std::promise<absl::Status> first, second;
  t0.send(1, tag, buf.data(), 16, [&](absl::Status st) { first.set_value(st); });
  // A TP collective's message has no step in its tag: it gets the rank's.
  t0.send(1, collective_tag(0, GroupKind::kTensor, 9, 0, 0), buf.data(), 16,
          [&](absl::Status st) { second.set_value(st); });
  const trace::Recorder::Contents c = r0.contents();
  EXPECT_EQ(c.open.size(), 2u);  // in the window, not yet received
  if (c.open.size() == 2u) {
    EXPECT_EQ(c.open[0].step, 70000);
    EXPECT_EQ(c.open[1].step, 70000);
    EXPECT_EQ(c.open[1].seq, 9);
  }
  // Both sends complete (with the error) before the recorder goes away.
  t0.fail_peer(1, absl::UnavailableError("end of test"));
  EXPECT_FALSE(first.get_future().get().ok());
  EXPECT_FALSE(second.get_future().get().ok());
}

}  // namespace
}  // namespace troupe::comm
