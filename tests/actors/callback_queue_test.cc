// comm::CallbackQueue: a callback that throws (anything) does not end the
// process; the queue keeps the first error, tells its owner, runs the rest.
#include "comm/callback_queue.h"

#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <vector>

namespace troupe::comm {
namespace {

TEST(CallbackQueue, ACallbackThatThrowsIsAnErrorAndTheRestStillRun) {
  std::vector<std::string> told;
  std::promise<void> done;
  std::vector<int> ran;
  {
    CallbackQueue q("test",
                    [&](const absl::Status& st) { told.push_back(std::string(st.message())); });
    q.post([&] { ran.push_back(1); });
    q.post([] { throw std::runtime_error("receiver gone"); });
    q.post([] { throw 7; });
    q.post([&] {
      ran.push_back(2);
      done.set_value();
    });
    done.get_future().wait();
    absl::Status st = q.status();
    EXPECT_TRUE(absl::IsInternal(st)) << st;
    EXPECT_EQ(st.message(), "a completion callback threw: receiver gone");  // the first
  }
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[1], "a completion callback threw: an exception that is not a std::exception");
}

}  // namespace
}  // namespace troupe::comm
