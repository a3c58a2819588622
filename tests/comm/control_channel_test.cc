// The control channel: frames both ways after the token handshake (through
// the hub's local socket, and through TCP); a wrong token, junk, an absurd
// length or silence is refused or cut off while the hub goes on; heartbeats
// tell a hung peer from a live one.
#include "comm/control_channel.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "comm/auth.h"
#include "comm/socket_io.h"

namespace troupe::comm {
namespace {

const std::string kToken = "a job token for the control channel tests";

// What the hub heard, for the test to wait on.
struct Heard {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::string> hellos;
  std::map<int, std::vector<std::string>> frames;
  std::map<int, absl::Status> lost;

  ControlHub::Handlers handlers() {
    return {[this](int r, const std::string& h) {
              std::lock_guard<std::mutex> l(mu);
              hellos[r] = h;
              cv.notify_all();
              return true;
            },
            [this](int r, std::string f) {
              std::lock_guard<std::mutex> l(mu);
              frames[r].push_back(std::move(f));
              cv.notify_all();
            },
            [this](int r, absl::Status why) {
              std::lock_guard<std::mutex> l(mu);
              lost[r] = why;
              cv.notify_all();
            }};
  }
  template <typename Pred>
  bool wait(Pred pred, std::chrono::milliseconds within = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, within, pred);
  }
};

std::unique_ptr<ControlHub> hub(Heard& heard, ControlOptions o = {}) {
  if (o.token.empty()) o.token = kToken;
  o.log = [](const std::string&) {};
  auto h = ControlHub::listen("127.0.0.1", 0, o, heard.handlers());
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : nullptr;
}

std::unique_ptr<ControlLink> link(int port, int rank, ControlLink::OnFrame on_frame = nullptr,
                                  ControlLink::OnLost on_lost = nullptr, std::string token = kToken,
                                  ControlOptions o = {}) {
  o.token = std::move(token);
  auto l = ControlLink::connect(
      "127.0.0.1", port, rank, "hello from " + std::to_string(rank), o,
      on_frame ? on_frame : [](std::string) {}, on_lost ? on_lost : [](absl::Status) {});
  return l.ok() ? std::move(*l) : nullptr;
}

int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// A frame as the wire has it: "TRPC", kind, length, body.
std::string frame(std::uint32_t kind, std::uint64_t len, const std::string& body) {
  std::string f(16, '\0');
  const std::uint32_t magic = 0x43505254;
  std::memcpy(f.data(), &magic, 4);
  std::memcpy(f.data() + 4, &kind, 4);
  std::memcpy(f.data() + 8, &len, 8);
  return f + body;
}
std::string hello_frame(std::int32_t rank) {
  std::string body(4, '\0');
  std::memcpy(body.data(), &rank, 4);
  return frame(3, 4, body);
}

// Through the hub's local socket (a link told its name), through TCP to a
// hub listening on both (a link not told it, as on another host), and to a
// hub with no local socket.
enum class Way { kLocal, kTcp, kTcpOnly };
class ControlChannelBothWays : public ::testing::TestWithParam<Way> {};

TEST_P(ControlChannelBothWays, FramesBothWaysAndAGoodbye) {
  const bool local = GetParam() == Way::kLocal;
  Heard heard;
  auto h = hub(heard, {.local_socket = GetParam() != Way::kTcpOnly});
  ASSERT_EQ(h->local_name().empty(), GetParam() == Way::kTcpOnly);
  std::mutex mu;
  std::map<int, std::string> got;
  std::vector<std::unique_ptr<ControlLink>> links;
  for (int r = 0; r < 3; r++) {
    links.push_back(link(h->port(), r,
                         [&, r](std::string f) {
                           std::lock_guard<std::mutex> l(mu);
                           got[r] = f;
                         },
                         nullptr, kToken, {.local_name = local ? h->local_name() : ""}));
    ASSERT_NE(links.back(), nullptr);
    EXPECT_EQ(links.back()->local(), local);
  }
  ASSERT_TRUE(heard.wait([&] { return heard.hellos.size() == 3; }));
  EXPECT_EQ(heard.hellos[2], "hello from 2");
  const std::string big(1 << 20, 'b');  // larger than one socket read
  for (int r = 0; r < 3; r++) {
    ASSERT_TRUE(links[static_cast<std::size_t>(r)]->send("one").ok());
    ASSERT_TRUE(links[static_cast<std::size_t>(r)]->send(big).ok());
    ASSERT_TRUE(h->send(r, "to " + std::to_string(r)).ok());
  }
  ASSERT_TRUE(heard.wait([&] {
    for (int r = 0; r < 3; r++)
      if (heard.frames[r].size() < 2) return false;
    return true;
  }));
  EXPECT_EQ(heard.frames[1][0], "one");
  EXPECT_EQ(heard.frames[1][1], big);
  for (int i = 0; i < 500; i++) {
    std::lock_guard<std::mutex> l(mu);
    if (got.size() == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(got[2], "to 2");
  links[1].reset();  // says goodbye
  ASSERT_TRUE(heard.wait([&] { return heard.lost.count(1); }));
  EXPECT_TRUE(heard.lost[1].ok()) << heard.lost[1];
  EXPECT_TRUE(absl::IsUnavailable(h->send(1, "x")));
}

INSTANTIATE_TEST_SUITE_P(LocalSocketOrTcp, ControlChannelBothWays,
                         ::testing::Values(Way::kLocal, Way::kTcp, Way::kTcpOnly),
                         [](const auto& p) {
                           return p.param == Way::kLocal ? "Local"
                                  : p.param == Way::kTcp ? "Tcp"
                                                         : "TcpOnly";
                         });

// A link takes TCP wherever the local socket fails it: no hub listening
// under the name, or a listener that does not prove itself (it answers the
// handshake no better than a closed connection). The local socket refuses
// junk and a wrong token as TCP does; every hub's name is its own.
TEST(ControlChannel, ALinkTakesTcpWhereTheLocalSocketFailsIt) {
  Heard heard;
  auto h = hub(heard);
  auto nobody = link(h->port(), 0, nullptr, nullptr, kToken,
                     {.local_name = "troupe-test-nobody-listens-" + std::to_string(::getpid())});
  ASSERT_NE(nobody, nullptr);
  EXPECT_FALSE(nobody->local());

  // A squatter that accepts and says nothing: the link gives it 2 s, not its
  // whole 10 s handshake (which the TCP attempt then needs).
  const std::string squat = "troupe-test-squatter-" + std::to_string(::getpid());
  auto squatter = listen_local(squat);
  ASSERT_TRUE(squatter.ok()) << squatter.status();
  std::promise<int> held;
  std::thread holder([fd = *squatter, &held] {
    pollfd p{fd, POLLIN, 0};
    held.set_value(::poll(&p, 1, 10000) == 1 ? ::accept(fd, nullptr, nullptr) : -1);
  });
  auto squatted = link(h->port(), 1, nullptr, nullptr, kToken,
                       {.handshake = absl::Seconds(10), .local_name = squat});
  holder.join();
  ::close(held.get_future().get());
  ::close(*squatter);
  ASSERT_NE(squatted, nullptr);
  EXPECT_FALSE(squatted->local());
  for (const auto& l : {nobody.get(), squatted.get()}) ASSERT_TRUE(l->send("over tcp").ok());
  ASSERT_TRUE(
      heard.wait([&] { return heard.frames[0].size() == 1 && heard.frames[1].size() == 1; }));

  std::mutex log_mu;
  std::vector<std::string> logged;
  auto logging = ControlHub::listen("127.0.0.1", 0,
                                    {.token = kToken,
                                     .log =
                                         [&](const std::string& line) {
                                           std::lock_guard<std::mutex> l(log_mu);
                                           logged.push_back(line);
                                         }},
                                    heard.handlers());
  ASSERT_TRUE(logging.ok()) << logging.status();
  h = *std::move(logging);
  auto junk = connect_local(h->local_name());
  ASSERT_TRUE(junk.ok()) << junk.status();
  const std::string noise(512, '\x5a');
  (void)!::send(*junk, noise.data(), noise.size(), MSG_NOSIGNAL);
  auto wrong = connect_local(h->local_name());
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_TRUE(absl::IsPermissionDenied(
      prove_token(*wrong, "not this job's token at all",
                  std::chrono::steady_clock::now() + std::chrono::seconds(5))));
  for (int i = 0; i < 300 && h->refused_connections() < 2; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(h->refused_connections(), 2);
  {
    std::lock_guard<std::mutex> l(log_mu);
    ASSERT_FALSE(logged.empty());
    EXPECT_NE(logged[0].find("pid " + std::to_string(::getpid())), std::string::npos) << logged[0];
  }
  auto good = link(h->port(), 2, nullptr, nullptr, kToken, {.local_name = h->local_name()});
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->local());
  ::close(*junk);
  ::close(*wrong);

  Heard heard2;
  auto other = hub(heard2);
  EXPECT_NE(other->local_name(), h->local_name());
  EXPECT_TRUE(hub(heard2, {.local_socket = false})->local_name().empty());
}

// connect_local answers at once where the listener's backlog is full (a
// hub that stopped accepting): the link then takes TCP, whose connect has a
// deadline.
TEST(ControlChannel, ConnectLocalNeverWaits) {
  const std::string name = "troupe-test-full-" + std::to_string(::getpid());
  auto listener = listen_local(name);  // never accepts
  ASSERT_TRUE(listener.ok()) << listener.status();
  // (Were a connect to wait, this closes the listener after 5 s: the waiter
  // then hears NotFound, not Unavailable.)
  std::promise<void> done;
  bool closed = false;
  std::thread watchdog([&, fd = *listener] {
    if (done.get_future().wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ::close(fd);
      closed = true;
    }
  });
  std::vector<int> queued;
  absl::Status last;
  for (int i = 0; i < 1000 && last.ok(); i++) {
    absl::StatusOr<int> fd = connect_local(name);
    if (fd.ok()) {
      queued.push_back(*fd);
    } else {
      last = fd.status();
    }
  }
  done.set_value();
  watchdog.join();
  EXPECT_TRUE(absl::IsUnavailable(last)) << last << " after " << queued.size();
  for (int fd : queued) ::close(fd);
  if (!closed) ::close(*listener);
  EXPECT_TRUE(absl::IsNotFound(connect_local(name).status()));
}

TEST(ControlChannel, WrongTokenJunkAndAbsurdLengthsAreRefusedWhileTheHubGoesOn) {
  Heard heard;
  auto h = hub(heard);
  ASSERT_EQ(link(h->port(), 5, nullptr, nullptr, "not this job's token at all"), nullptr);
  // Junk before the handshake.
  const int junk = raw_connect(h->port());
  std::string noise(4096, '\0');
  for (std::size_t i = 0; i < noise.size(); i++) noise[i] = static_cast<char>(i * 131 + 7);
  (void)!::send(junk, noise.data(), noise.size(), MSG_NOSIGNAL);
  // The token proved, then a hello claiming 2^40 bytes.
  const int huge_hello = raw_connect(h->port());
  ASSERT_TRUE(
      prove_token(huge_hello, kToken, std::chrono::steady_clock::now() + std::chrono::seconds(5))
          .ok());
  const std::string absurd = frame(3, std::uint64_t{1} << 40, "");
  (void)!::send(huge_hello, absurd.data(), absurd.size(), MSG_NOSIGNAL);
  // A joined rank that then sends an absurd length is cut off.
  const int rogue = raw_connect(h->port());
  ASSERT_TRUE(
      prove_token(rogue, kToken, std::chrono::steady_clock::now() + std::chrono::seconds(5)).ok());
  const std::string hello = hello_frame(7);
  (void)!::send(rogue, hello.data(), hello.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(heard.wait([&] { return heard.hellos.count(7); }));
  const std::string bad = frame(1, std::uint64_t{1} << 62, "");
  (void)!::send(rogue, bad.data(), bad.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(heard.wait([&] { return heard.lost.count(7); }));
  EXPECT_TRUE(absl::IsDataLoss(heard.lost[7])) << heard.lost[7];
  // The hub goes on: a rank with the token joins and talks.
  auto good = link(h->port(), 1);
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->send("still here").ok());
  ASSERT_TRUE(heard.wait([&] { return heard.frames[1].size() == 1; }));
  // Refused: the wrong token's 5 attempts (a link tries again, backing off:
  // a flooded hub closes connections the same way), junk, the huge hello.
  for (int i = 0; i < 300 && h->refused_connections() < 7; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(h->refused_connections(), 7);
  for (int fd : {junk, huge_hello, rogue}) ::close(fd);
}

TEST(ControlChannel, HeartbeatsTellAHungPeerFromALiveOne) {
  Heard heard;
  auto h =
      hub(heard, {.heartbeat = absl::Milliseconds(100), .dead_after = absl::Milliseconds(700)});
  auto live = link(h->port(), 0, nullptr, nullptr, kToken,
                   {.heartbeat = absl::Milliseconds(100), .dead_after = absl::Milliseconds(700)});
  ASSERT_NE(live, nullptr);
  // A rank that joins and then says nothing more (a hung process).
  const int hung = raw_connect(h->port());
  ASSERT_TRUE(
      prove_token(hung, kToken, std::chrono::steady_clock::now() + std::chrono::seconds(5)).ok());
  const std::string hello = hello_frame(1);
  (void)!::send(hung, hello.data(), hello.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(heard.wait([&] { return heard.hellos.count(1); }));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(heard.wait([&] { return heard.lost.count(1); }));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(absl::IsDeadlineExceeded(heard.lost[1])) << heard.lost[1];
  EXPECT_LT(secs, 3.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // beyond dead_after
  std::lock_guard<std::mutex> l(heard.mu);
  EXPECT_EQ(heard.lost.count(0), 0u) << "a live link was taken for a hung one";
  ::close(hung);
}

// A rank that joins and stops reading, while the coordinator keeps sending
// to it until its window is full: the hub's thread never blocks on it (it
// once did, in heartbeats and in closing, and live links then timed out).
TEST(ControlChannel, APeerThatStopsReadingDoesNotStallTheHub) {
  Heard heard;
  const ControlOptions fast{.heartbeat = absl::Milliseconds(100),
                            .dead_after = absl::Milliseconds(800)};
  auto h = hub(heard, fast);
  std::atomic<bool> live_lost{false};
  auto live = link(
      h->port(), 0, nullptr, [&](absl::Status) { live_lost = true; }, kToken, fast);
  ASSERT_NE(live, nullptr);
  const int stuck = raw_connect(h->port());
  ASSERT_TRUE(
      prove_token(stuck, kToken, std::chrono::steady_clock::now() + std::chrono::seconds(5)).ok());
  const std::string hello = hello_frame(1);
  (void)!::send(stuck, hello.data(), hello.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(heard.wait([&] { return heard.hellos.count(1); }));
  std::atomic<bool> stop{false};
  std::thread flood([&] {  // the coordinator's thread, blocking in send()
    const std::string big(1 << 20, 'f');
    while (!stop && h->send(1, big).ok()) {
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
    ASSERT_TRUE(live->send("ping").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  flood.join();
  EXPECT_FALSE(live_lost.load()) << "a live link was dropped while another peer stalled";
  std::lock_guard<std::mutex> l(heard.mu);
  EXPECT_EQ(heard.lost.count(0), 0u);
  EXPECT_EQ(heard.lost.count(1), 1u) << "the stalled peer was never dropped";
  ::close(stuck);
}

TEST(ControlChannel, LinkHearsWhenTheHubGoes) {
  Heard heard;
  auto h = hub(heard);
  std::promise<absl::Status> lost;
  auto f = lost.get_future();
  auto l = link(h->port(), 0, nullptr, [&](absl::Status why) { lost.set_value(why); });
  ASSERT_NE(l, nullptr);
  ASSERT_TRUE(heard.wait([&] { return heard.hellos.count(0); }));
  h.reset();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());  // the hub said goodbye
  EXPECT_TRUE(absl::IsInvalidArgument(
      ControlLink::connect("127.0.0.1", 1, 0, "", {}, nullptr, nullptr).status()));  // no token
}

}  // namespace
}  // namespace troupe::comm
