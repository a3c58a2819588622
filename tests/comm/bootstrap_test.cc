// The TCP bootstrap: address exchange, and the finish() barrier whatever the
// order in which ranks arrive at it while the liveness check is watching.
#include "comm/bootstrap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <thread>

namespace troupe::comm {
namespace {

int port_for(int k) { return 21000 + static_cast<int>((::getpid() * 13 + k * 101) % 20000); }

// A regression: rank 0's watcher once swallowed a rank's FIN, and finish()
// waited for it forever when that rank finished first.
TEST(Bootstrap, FinishInAnyOrderWhileWatching) {
  for (int first : {0, 1, 2}) {
    const int size = 3, port = port_for(first);
    std::vector<std::future<absl::Status>> done;
    for (int r = 0; r < size; r++) {
      done.push_back(std::async(std::launch::async, [=] {
        auto b = Bootstrap::start(r, size, "127.0.0.1", port, absl::Seconds(30));
        if (!b.ok()) return b.status();
        auto all = (*b)->all_gather("rank" + std::to_string(r));
        if (!all.ok()) return all.status();
        if ((*all)[2] != "rank2") return absl::InternalError("bad exchange");
        (*b)->watch([](int, absl::Status) {});
        std::this_thread::sleep_for(std::chrono::milliseconds(r == first ? 10 : 300));
        return (*b)->finish();
      }));
    }
    for (auto& f : done) {
      ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready)
          << "first=" << first << " hangs";
      EXPECT_TRUE(f.get().ok());
    }
  }
}

}  // namespace
}  // namespace troupe::comm
