// CPU streams: order, host callbacks, events across streams, sticky errors,
// and results that do not depend on a stream's thread count.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "gpu/cpu/cpu_device.h"
#include "gpu/ops.h"
#include "tests/test_util.h"

namespace troupe::testing {
namespace {

using gpu::Tensor;
namespace ops = gpu::ops;

TEST(CpuStream, RunsWorkInOrderAndCallsBack) {
  auto s = gpu::cpu_device().make_stream({.threads = 1});
  std::vector<int> seen;
  for (int i = 0; i < 100; i++) s->host_callback([&seen, i] { seen.push_back(i); });
  ASSERT_TRUE(s->synchronize().ok());
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; i++) EXPECT_EQ(seen[i], i);
}

TEST(CpuStream, OpsRunAfterEarlierOpsOnTheSameStream) {
  auto s = gpu::cpu_device().make_stream({.threads = 2});
  Tensor x = filled({1000}, 0.0f);
  ops::fill(*s, x, 1.0f);
  ops::axpy(*s, x, 2.0f, x);  // x = 1 + 2*1
  ASSERT_TRUE(s->synchronize().ok());
  EXPECT_EQ(x.data<float>()[999], 3.0f);
}

TEST(CpuStream, WaitOnEventOrdersTwoStreams) {
  auto& dev = gpu::cpu_device();
  auto producer = dev.make_stream({.threads = 1});
  auto consumer = dev.make_stream({.threads = 1});
  auto ready = dev.make_event();
  std::atomic<bool> produced{false};
  bool saw_product = false;
  producer->host_callback([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    produced = true;
  });
  producer->record(*ready);
  consumer->wait(*ready);
  consumer->host_callback([&] { saw_product = produced.load(); });
  ASSERT_TRUE(consumer->synchronize().ok());
  EXPECT_TRUE(saw_product);
  EXPECT_TRUE(ready->query());
}

// A stream's wait for an event not yet complete is a gate the event opens;
// unlike a receive's, a stream that fails meanwhile still holds there (what
// it runs behind the wait, its control tasks, may touch what the other
// stream writes), and goes on once the event completes.
TEST(CpuStream, AFailedStreamStillWaitsForItsEvent) {
  auto& dev = gpu::cpu_device();
  auto producer = dev.make_stream({.threads = 1});
  auto consumer = dev.make_stream({.threads = 1});
  auto ready = dev.make_event();
  gpu::GateOpener hold = producer->gate();
  producer->record(*ready);
  consumer->wait(*ready);
  std::atomic<bool> told{false};
  consumer->host_callback([&] { told = true; });
  consumer->fail(absl::UnavailableError("peer gone"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(told.load());  // behind the wait
  EXPECT_FALSE(ready->query());
  hold(absl::OkStatus());
  EXPECT_EQ(consumer->synchronize().message(), "peer gone");
  EXPECT_TRUE(told.load());
  EXPECT_TRUE(ready->query());
  consumer->wait(*ready);  // complete: nothing to wait for
  EXPECT_EQ(consumer->synchronize().message(), "peer gone");
}

// Work enqueued in a gpu::StreamBatch onto an idle stream starts when the
// batch ends, the outermost of nested ones; a synchronize on the batch's
// thread, of the stream or of an event, starts it at once (no deadlock).
TEST(CpuStream, AStreamBatchStartsItsWorkWhenItEnds) {
  auto& dev = gpu::cpu_device();
  auto s = dev.make_stream({.threads = 1});
  // Deferred to the outer batch's end, when the stream's thread was asleep
  // at the enqueue (a thread not yet asleep finds the work itself: up to
  // five tries, so that a descheduled one does not fail the test).
  std::atomic<int> ran{0};
  bool deferred = false;
  for (int attempt = 0; attempt < 5 && !deferred; attempt++) {
    ASSERT_TRUE(s->synchronize().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its thread asleep
    ran = 0;
    {
      gpu::StreamBatch outer;
      {
        gpu::StreamBatch inner;
        s->host_callback([&] { ran++; });
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      deferred = ran.load() == 0;
    }
    ASSERT_TRUE(s->synchronize().ok());
    EXPECT_EQ(ran.load(), 1);
  }
  EXPECT_TRUE(deferred) << "the work started inside the batch five times";
  {
    gpu::StreamBatch batch;
    s->host_callback([&] { ran++; });
    ASSERT_TRUE(s->synchronize().ok());
    EXPECT_EQ(ran.load(), 2);
    auto done = dev.make_event();
    s->host_callback([&] { ran++; });
    s->record(*done);
    done->synchronize();
    EXPECT_EQ(ran.load(), 3);
  }
}

// A waiter may destroy the event the moment it sees it complete: the
// recording stream must be done with it by then (it once notified the
// event's condition variable after unlocking, racing with the destruction;
// ThreadSanitizer and AddressSanitizer builds catch that here).
TEST(CpuStream, EventCanBeDestroyedAsSoonAsItsWaitReturns) {
  auto& dev = gpu::cpu_device();
  auto s = dev.make_stream({.threads = 1});
  for (int i = 0; i < 2000; i++) {
    auto done = dev.make_event();
    s->record(*done);
    done->synchronize();
    done.reset();
  }
  ASSERT_TRUE(s->synchronize().ok());
}

TEST(CpuStream, ErrorsAreStickyButCallbacksStillRun) {
  auto s = gpu::cpu_device().make_stream({.threads = 1});
  Tensor x = filled({10}, 5.0f);
  s->fail(absl::InternalError("first"));
  s->fail(absl::InternalError("second"));
  ops::fill(*s, x, 0.0f);  // skipped
  bool called = false;
  s->host_callback([&] { called = true; });
  absl::Status st = s->synchronize();
  EXPECT_EQ(st.message(), "first");
  EXPECT_TRUE(called);
  EXPECT_EQ(x.data<float>()[0], 5.0f);
}

TEST(CpuStream, ExceptionInAnOpBecomesAnError) {
  auto& dev = gpu::cpu_device();
  auto s = dev.make_stream({.threads = 1});
  static_cast<gpu::CpuStream&>(*s).enqueue_op("boom", [] { throw std::runtime_error("bad"); });
  absl::Status st = s->synchronize();
  EXPECT_TRUE(absl::IsInternal(st));
  EXPECT_EQ(st.message(), "boom: bad");
}

// A gate holds back exactly the work behind it, whichever thread opens it.
TEST(CpuStream, AGateHoldsTheWorkBehindItUntilAnotherThreadOpensIt) {
  auto s = gpu::cpu_device().make_stream({.threads = 1});
  std::promise<void> before;
  std::atomic<bool> behind{false};
  s->host_callback([&] { before.set_value(); });
  gpu::GateOpener open = s->gate();
  ASSERT_TRUE(s->has_gates());
  s->host_callback([&] { behind = true; });
  before.get_future().wait();  // the work before it ran
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(behind.load());  // the work behind it did not
  std::thread opener([&] { open(absl::OkStatus()); });
  ASSERT_TRUE(s->synchronize().ok());
  opener.join();
  EXPECT_TRUE(behind.load());
  open(absl::OkStatus());  // a second opening changes nothing
}

// Opened before the stream gets to it, it is no wait at all; opened with
// an error, the ops behind it are skipped and callbacks still run.
TEST(CpuStream, AGateOpenedWithAnErrorFailsTheStream) {
  auto s = gpu::cpu_device().make_stream({.threads = 1});
  Tensor x = filled({10}, 5.0f);
  s->gate()(absl::OkStatus());
  gpu::GateOpener open = s->gate();
  ops::fill(*s, x, 0.0f);  // skipped
  bool called = false;
  s->host_callback([&] { called = true; });
  open(absl::UnavailableError("receive from rank 3: gone"));
  const absl::Status st = s->synchronize();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_EQ(st.message(), "receive from rank 3: gone");
  EXPECT_TRUE(called);
  EXPECT_EQ(x.data<float>()[0], 5.0f);
}

// A note (Stream::host_note) on a stream with work queued or running, or
// held at a gate, runs on the stream's thread once the stream gets there; on
// an idle stream it runs at once, on the caller's thread, as no worker has to
// wake for it.
TEST(CpuStream, ANoteWaitsForEarlierWorkAndRunsAtOnceOnAnIdleStream) {
  auto s = gpu::cpu_device().make_stream({.threads = 1});
  const std::thread::id caller = std::this_thread::get_id();
  std::promise<void> go;
  std::shared_future<void> let_go = go.get_future().share();
  std::atomic<bool> noted{false};
  std::thread::id where;
  s->host_callback([let_go] { let_go.wait(); });  // busy until `go`
  s->host_note([&] {
    where = std::this_thread::get_id();
    noted = true;
  });
  EXPECT_FALSE(noted.load());
  go.set_value();
  ASSERT_TRUE(s->synchronize().ok());
  EXPECT_TRUE(noted.load());
  EXPECT_NE(where, caller);

  gpu::GateOpener open = s->gate();
  noted = false;
  s->host_note([&] { noted = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(noted.load());  // held at the gate with the note behind it
  open(absl::OkStatus());
  ASSERT_TRUE(s->synchronize().ok());
  EXPECT_TRUE(noted.load());

  // Idle: once the worker is asleep (it may take a moment after the last
  // task), the note runs inside host_note.
  bool inline_once = false;
  for (int i = 0; i < 200 && !inline_once; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::thread::id ran;
    s->host_note([&ran] { ran = std::this_thread::get_id(); });
    ASSERT_TRUE(s->synchronize().ok());  // (queued: it has run by now)
    inline_once = ran == caller;
  }
  EXPECT_TRUE(inline_once);

  // Work queued whose wake-up a StreamBatch defers (the worker may be
  // asleep on it): the note waits behind it.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<int> order;
  {
    gpu::StreamBatch batch;
    s->host_callback([&order] { order.push_back(1); });
    s->host_note([&order] { order.push_back(2); });
  }
  ASSERT_TRUE(s->synchronize().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// A gate whose openers are all dropped uncalled (a receive's callback
// destroyed without being run) opens as Cancelled: nothing waits forever.
TEST(CpuStream, AGateWhoseOpenerIsDroppedUncalledIsCancelled) {
  auto s = gpu::cpu_device().make_stream({.threads = 1});
  gpu::GateOpener open = s->gate();
  gpu::GateOpener copy = open;
  open = nullptr;
  s->host_callback([] {});
  copy = nullptr;
  EXPECT_TRUE(absl::IsCancelled(s->synchronize()));
}

// A stream that fails, or is destroyed, at a closed gate goes past it: its
// ops are skipped, its control tasks (the actors' callbacks) run.
TEST(CpuStream, AFailedOrDestroyedStreamPassesAClosedGate) {
  auto failing = gpu::cpu_device().make_stream({.threads = 1});
  gpu::GateOpener held = failing->gate();
  bool told = false;
  failing->host_callback([&] { told = true; });
  failing->fail(absl::InternalError("a collective failed"));
  EXPECT_EQ(failing->synchronize().message(), "a collective failed");
  EXPECT_TRUE(told);

  gpu::GateOpener late;
  bool ran = false, called = false;
  {
    auto s = gpu::cpu_device().make_stream({.threads = 1});
    late = s->gate();
    static_cast<gpu::CpuStream&>(*s).enqueue_op("op", [&] { ran = true; });
    s->host_callback([&] { called = true; });
  }
  EXPECT_FALSE(ran);
  EXPECT_TRUE(called);
  late(absl::OkStatus());  // the stream is gone: nothing to open
}

// Our own reductions (LayerNorm and embedding parameter gradients, the norm)
// are summed in a fixed order, so one thread and two give the same bits.
TEST(CpuStream, OwnReductionsAreIndependentOfThreadCount) {
  std::mt19937 rng(7);
  const int N = 300, C = 96, Vp = 50, B = 3, T = 100;
  Tensor x = random_tensor(rng, {N, C}), w = random_tensor(rng, {C}), b = random_tensor(rng, {C});
  Tensor dout = random_tensor(rng, {N, C});
  std::vector<std::int32_t> tok(B * T);
  for (auto& t : tok) t = static_cast<std::int32_t>(rng() % Vp);
  Tensor tokens = int_tensor(tok, {B, T});
  auto run = [&](int threads) {
    auto s = gpu::cpu_device().make_stream({.threads = threads});
    Tensor out = filled({N, C}, 0), mean = filled({N}, 0), rstd = filled({N}, 0);
    Tensor dx = filled({N, C}, 0), dw = filled({C}, 0), db = filled({C}, 0);
    Tensor dwte = filled({Vp, C}, 0), dwpe = filled({T, C}, 0);
    Tensor norm = Tensor::empty(gpu::cpu_device(), gpu::DType::kF64, {1});
    ops::layernorm_forward(*s, out, mean, rstd, x, w, b);
    ops::layernorm_backward(*s, dx, dw, db, dout, x, w, mean, rstd);
    ops::embedding_backward(*s, dwte, dwpe, dout.reshape({B, T, C}), tokens);
    ops::squared_norm(*s, norm, dx);
    EXPECT_TRUE(s->synchronize().ok());
    std::vector<float> all;
    for (const Tensor& t : {out, dx, dw, db, dwte, dwpe}) {
      all.insert(all.end(), t.data<float>(), t.data<float>() + t.numel());
    }
    double n = *norm.data<double>();
    float parts[2];
    std::memcpy(parts, &n, sizeof n);
    all.insert(all.end(), parts, parts + 2);
    return all;
  };
  std::vector<float> one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace troupe::testing
