// An actor enqueues work on a stream and is told, by message, when it is done.
#include "actors/rank/stream_bridge.h"

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <future>

#include "gpu/ops.h"
#include "tests/test_util.h"

namespace troupe::actors {
namespace {

using done_atom = caf::atom_constant<caf::atom("done")>;

TEST(StreamBridge, ActorHearsWhenItsStreamWorkIsDone) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  auto stream = gpu::cpu_device().make_stream({.threads = 1});
  gpu::Tensor x = testing::filled({1 << 16}, 0.0f);
  std::promise<float> seen;
  auto fut = seen.get_future();
  auto worker = sys.spawn([&](caf::event_based_actor* self) -> caf::behavior {
    return {[&, self](done_atom, int tag) {
      EXPECT_EQ(tag, 7);
      EXPECT_TRUE(stream->status().ok());
      seen.set_value(x.data<float>()[(1 << 16) - 1]);  // the work is visible
      self->quit();
    }};
  });
  gpu::ops::fill(*stream, x, 3.0f);
  send_when_done(*stream, worker, caf::make_message(done_atom::value, 7));
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(fut.get(), 3.0f);
}

}  // namespace
}  // namespace troupe::actors
