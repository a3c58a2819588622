// The TCP bootstrap: address exchange, and the finish() barrier whatever the
// order in which ranks arrive at it while the liveness check is watching.
#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <thread>

#include "tests/free_port.h"

namespace troupe::comm {
namespace {

// Rank 0's port is the kernel's pick (tests/free_port.h): one from the pid
// once fell in the ephemeral range, held by another connection, and rank 0
// could not listen.
using troupe::testing::free_tcp_port;

// A regression: rank 0's watcher once swallowed a rank's FIN, and finish()
// waited for it forever when that rank finished first.
TEST(Bootstrap, FinishInAnyOrderWhileWatching) {
  for (int first : {0, 1, 2}) {
    const int size = 3, port = free_tcp_port();
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

// A client of rank 0's port that is not a rank: connects (retrying until
// rank 0 listens) and sends `bytes`. Returns the socket (closed by the caller).
int stray_client(int port, const std::string& bytes) {
  for (int i = 0; i < 500; i++) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      if (!bytes.empty()) {
        EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
      }
      return fd;
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "rank 0 never listened";
  return -1;
}

// Whether the other side closed `fd` (waits up to 5 s).
bool closed_by_peer(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  for (;;) {  // what the listener said before closing (a challenge) is read past
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    // A close with our bytes unread is a reset.
    if (n <= 0) return n == 0 || errno == ECONNRESET;
  }
}

// Connections that are not ranks -- garbage, a silent one, half a header,
// a claim to a rank that does not exist -- are closed and logged, and the
// rendezvous goes on without them (a bad hello once failed the whole
// rendezvous, and half a header blocked rank 0 for ever).
TEST(Bootstrap, StrayConnectionsAreRefusedAndTheRendezvousGoesOn) {
  const int size = 3, port = free_tcp_port();
  std::atomic<int> logged{0};
  auto zero = std::async(std::launch::async, [&] {
    return Bootstrap::start(0, size, "127.0.0.1", port, absl::Seconds(20),
                            {.log = [&](const std::string& line) {
                              if (line.find("refused a connection") != std::string::npos) logged++;
                            }});
  });
  std::string half(8, '\x01'), bad_rank(24, '\0');
  const std::uint32_t magic = 0x42505254, hello = 1;
  const std::int32_t rank7 = 7;
  std::memcpy(bad_rank.data(), &magic, 4);
  std::memcpy(bad_rank.data() + 4, &hello, 4);
  std::memcpy(bad_rank.data() + 8, &rank7, 4);
  std::vector<int> strays = {stray_client(port, "GET / HTTP/1.0\r\n\r\n"), stray_client(port, half),
                             stray_client(port, bad_rank), stray_client(port, "")};
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::future<absl::Status>> ranks;
  for (int r = 1; r < size; r++) {
    ranks.push_back(std::async(std::launch::async, [=] {
      return Bootstrap::start(r, size, "127.0.0.1", port, absl::Seconds(20)).status();
    }));
  }
  ASSERT_EQ(zero.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "rank 0 hangs";
  auto b = zero.get();
  ASSERT_TRUE(b.ok()) << b.status();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 10.0);
  for (auto& f : ranks) EXPECT_TRUE(f.get().ok());
  EXPECT_EQ((*b)->refused_connections(), 4);
  EXPECT_EQ(logged.load(), 4);
  for (int fd : strays) {
    EXPECT_TRUE(closed_by_peer(fd)) << "a refused connection was left open";
    ::close(fd);
  }
}

// A rank that is alive but never takes part: rank 0's all_gather and
// finish end with an error naming it after the timeout (they once waited
// for ever), and so does the waiting rank's all_gather.
TEST(Bootstrap, StuckRankIsAnErrorNamingItNotAHang) {
  const int size = 3, port = free_tcp_port();
  std::vector<std::future<absl::Status>> done;
  std::promise<void> release;
  auto released = release.get_future().share();
  for (int r = 0; r < size; r++) {
    done.push_back(std::async(std::launch::async, [=] {
      auto b = Bootstrap::start(r, size, "127.0.0.1", port, absl::Seconds(1));
      if (!b.ok()) return b.status();
      if (r == 2) {  // connected, then stuck
        released.wait();
        return absl::OkStatus();
      }
      return (*b)->all_gather("x").status();
    }));
  }
  for (int r = 0; r < 2; r++) {
    auto& f = done[static_cast<std::size_t>(r)];
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready) << r << " hangs";
    absl::Status st = f.get();
    if (r == 0) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
      EXPECT_NE(st.message().find("rank 2 sent no address"), std::string::npos) << st;
    } else {  // its own deadline, or rank 0 closing after its error: whichever is first
      EXPECT_TRUE(absl::IsDeadlineExceeded(st) || absl::IsUnavailable(st)) << st;
      EXPECT_NE(st.message().find("waiting for rank 0's address table"), std::string::npos) << st;
    }
  }
  release.set_value();
  EXPECT_TRUE(done[2].get().ok());

  // finish(): rank 1 never arrives at the barrier.
  const int port2 = free_tcp_port();
  std::promise<void> release2;
  auto released2 = release2.get_future().share();
  auto one = std::async(std::launch::async, [=] {
    auto b = Bootstrap::start(1, 2, "127.0.0.1", port2, absl::Seconds(1));
    if (b.ok()) released2.wait();
  });
  auto b0 = Bootstrap::start(0, 2, "127.0.0.1", port2, absl::Seconds(1));
  ASSERT_TRUE(b0.ok()) << b0.status();
  auto fin = std::async(std::launch::async, [&] { return (*b0)->finish(); });
  ASSERT_EQ(fin.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "finish hangs";
  absl::Status st = fin.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("rank 1 sent no finish"), std::string::npos) << st;
  release2.set_value();
  one.get();
}

// With a job token: a rank with another token is refused (and told so),
// stray bytes are refused, and the ranks holding it meet.
TEST(Bootstrap, JobTokenIsProvedBeforeAnythingIsRead) {
  const int size = 2, port = free_tcp_port();
  const std::string token = "0123456789abcdef0123456789abcdef";
  std::atomic<int> logged{0};
  auto zero = std::async(std::launch::async, [&] {
    return Bootstrap::start(0, size, "127.0.0.1", port, absl::Seconds(20),
                            {.token = token, .log = [&](const std::string& line) {
                               if (line.find("job token") != std::string::npos) logged++;
                             }});
  });
  const int junk = stray_client(port, std::string(100, 'x'));
  auto impostor = Bootstrap::start(1, size, "127.0.0.1", port, absl::Seconds(5),
                                   {.token = "another job's token, long enough"});
  ASSERT_FALSE(impostor.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(impostor.status())) << impostor.status();
  auto one = Bootstrap::start(1, size, "127.0.0.1", port, absl::Seconds(20), {.token = token});
  ASSERT_TRUE(one.ok()) << one.status();
  auto b = zero.get();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->refused_connections(), 2);
  EXPECT_EQ(logged.load(), 2);
  EXPECT_TRUE(closed_by_peer(junk));
  ::close(junk);
  auto all = std::async(std::launch::async, [&] { return (*one)->all_gather("one"); });
  auto mine = (*b)->all_gather("zero");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ((*mine)[1], "one");
  EXPECT_TRUE(all.get().ok());
}

}  // namespace
}  // namespace troupe::comm
