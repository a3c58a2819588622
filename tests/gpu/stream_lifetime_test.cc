// Streams and events on every backend present: an event may be destroyed
// while a stream's record or wait of it is still queued, and an exception of
// any type out of an op or a host callback fails the stream (Internal) instead
// of ending the process.
#include <gtest/gtest.h>

#include <future>
#include <stdexcept>

#include "gpu/cpu/cpu_device.h"
#ifdef TROUPE_HAVE_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace troupe::gpu {
namespace {

// Holds a stream's worker until released, so what is enqueued after it waits.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  void hold(Stream& s) {
    s.host_callback([f = opened] { f.wait(); });
  }
};

// Without the shared state, the queued record wrote into the freed event: the
// allocator hands its memory to the next event of the same size, so that
// one completed at once, although its own stream had not reached it.
TEST(CpuEvent, MayBeDestroyedWhileARecordOfItIsQueued) {
  Device& dev = cpu_device();
  auto a = dev.make_stream({.threads = 1});
  auto b = dev.make_stream({.threads = 1});
  Gate gate_a, gate_b;
  gate_a.hold(*a);
  gate_b.hold(*b);
  std::unique_ptr<Event> gone = dev.make_event();
  a->record(*gone);
  a->wait(*gone);
  gone.reset();
  std::unique_ptr<Event> next = dev.make_event();  // often the same memory
  b->record(*next);
  gate_a.open.set_value();
  ASSERT_TRUE(a->synchronize().ok());
  EXPECT_FALSE(next->query()) << "stream a's record of the destroyed event completed this one";
  gate_b.open.set_value();
  ASSERT_TRUE(b->synchronize().ok());
  EXPECT_TRUE(next->query());
}

TEST(CpuEvent, AWaitOfADestroyedEventStillWaitsForItsRecord) {
  Device& dev = cpu_device();
  auto producer = dev.make_stream({.threads = 1});
  auto consumer = dev.make_stream({.threads = 1});
  Gate gate;
  gate.hold(*producer);
  bool produced = false, seen = false;
  producer->host_callback([&] { produced = true; });
  {
    std::unique_ptr<Event> e = dev.make_event();
    producer->record(*e);
    consumer->wait(*e);
  }
  consumer->host_callback([&] { seen = produced; });
  gate.open.set_value();
  ASSERT_TRUE(consumer->synchronize().ok());
  EXPECT_TRUE(seen);
}

std::vector<std::unique_ptr<Device>>& other_backends() {
  static auto* devices = [] {
    auto* v = new std::vector<std::unique_ptr<Device>>;
#ifdef TROUPE_HAVE_CUDA
    if (cuda_device_count() > 0) {
      if (auto d = make_cuda_device(0); d.ok()) v->push_back(*std::move(d));
    }
#endif
    return v;
  }();
  return *devices;
}

void expect_throwing_callbacks_fail_the_stream(Device& dev) {
  SCOPED_TRACE(dev.name());
  auto s = dev.make_stream({.threads = 1});
  s->host_callback([] { throw 42; });  // not a std::exception
  bool later = false;
  s->host_callback([&] { later = true; });  // callbacks still run
  absl::Status st = s->synchronize();
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_EQ(st.message(), "host callback: an exception that is not a std::exception");
  EXPECT_TRUE(later);

  auto t = dev.make_stream({.threads = 1});
  t->host_callback([] { throw std::runtime_error("the actor is gone"); });
  st = t->synchronize();
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_EQ(st.message(), "host callback: the actor is gone");
}

TEST(Stream, AHostCallbackThatThrowsAnythingFailsTheStream) {
  expect_throwing_callbacks_fail_the_stream(cpu_device());
  for (auto& d : other_backends()) expect_throwing_callbacks_fail_the_stream(*d);
  if (other_backends().empty()) std::printf("(no CUDA device here: CPU backend only)\n");
}

TEST(CpuStream, AnOpThatThrowsANonStdExceptionFailsTheStream) {
  auto s = cpu_device().make_stream({.threads = 1});
  static_cast<CpuStream&>(*s).enqueue_op("boom", [] { throw "a C string"; });
  absl::Status st = s->synchronize();
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_EQ(st.message(), "boom: an exception that is not a std::exception");
}

}  // namespace
}  // namespace troupe::gpu
