// comm::stream_channel: in-order point-to-point over a transport, as NCCL's
// ncclSend/ncclRecv behave (the k-th send fills the peer's k-th receive),
// and its failures.
#include "comm/stream_channel.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "comm/inproc_transport.h"

namespace troupe::comm {
namespace {

std::vector<float> iota(std::size_t n, float from) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; i++) v[i] = from + static_cast<float>(i);
  return v;
}

// Three sends of different sizes arrive in their order, and channels of
// other kinds stay apart. (A send waits for its receive, as NCCL's may: the
// gradient goes from a thread of its own.)
TEST(StreamChannel, TheKthSendFillsTheKthReceive) {
  auto fabric = std::make_shared<InProcFabric>(2);
  std::unique_ptr<Transport> t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
  auto a0 = stream_channel(t0.get(), MessageKind::kActivation);
  auto a1 = stream_channel(t1.get(), MessageKind::kActivation);
  auto g0 = stream_channel(t0.get(), MessageKind::kGradient);
  auto g1 = stream_channel(t1.get(), MessageKind::kGradient);
  const std::vector<std::size_t> sizes = {1, 1000, 7};
  std::thread sender([&] {
    for (std::size_t k = 0; k < sizes.size(); k++) {
      const std::vector<float> v = iota(sizes[k], 100.0f * static_cast<float>(k));
      EXPECT_TRUE(a0->send_on(nullptr, v.data(), v.size() * 4, 1).ok());
    }
  });
  std::thread gradient_sender([&] {
    const std::vector<float> g = iota(5, -9.0f);
    EXPECT_TRUE(g0->send_on(nullptr, g.data(), g.size() * 4, 1).ok());
  });
  // The gradient first: a channel of another kind is not in the way.
  std::vector<float> g(5);
  ASSERT_TRUE(g1->recv_on(nullptr, g.data(), g.size() * 4, 0).ok());
  EXPECT_EQ(g, iota(5, -9.0f));
  for (std::size_t k = 0; k < sizes.size(); k++) {
    std::vector<float> got(sizes[k], -1.0f);
    ASSERT_TRUE(a1->recv_on(nullptr, got.data(), got.size() * 4, 0).ok()) << "message " << k;
    EXPECT_EQ(got, iota(sizes[k], 100.0f * static_cast<float>(k))) << "message " << k;
  }
  sender.join();
  gradient_sender.join();
}

// A receive whose peer fails ends, Unavailable, naming the peer; a call on
// a native (GPU) stream and a peer outside the transport are errors.
TEST(StreamChannel, FailuresAreErrorsNotHangs) {
  auto fabric = std::make_shared<InProcFabric>(2);
  std::unique_ptr<Transport> t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
  auto a1 = stream_channel(t1.get(), MessageKind::kActivation);
  std::vector<float> buf(4);
  std::thread failer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t1->fail_peer(0, absl::UnavailableError("rank 0 died"));
  });
  const absl::Status st = a1->recv_on(nullptr, buf.data(), buf.size() * 4, 0);
  failer.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("rank 0"), absl::string_view::npos) << st;
  int native = 0;
  EXPECT_EQ(a1->recv_on(&native, buf.data(), buf.size(), 0).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(a1->send_on(nullptr, buf.data(), buf.size(), 1).code(),
            absl::StatusCode::kInvalidArgument);  // itself
  EXPECT_EQ(a1->send_on(nullptr, buf.data(), buf.size(), 2).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::comm
