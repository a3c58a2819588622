// The control channel's hub and links; see comm/control_channel.h.
//
// Wire: after the token handshake (comm/auth.h), frames of a 16-byte header
// (magic "TRPC", kind, length) and `length` bytes. A link's first frame is
// its hello (rank, then the caller's payload); then data, heartbeats and a
// final goodbye, in both directions.
#include "comm/control_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/auth.h"
#include "comm/socket_io.h"
#include "gpu/thread_name.h"

namespace troupe::comm {
namespace control_internal {

using Clock = std::chrono::steady_clock;

enum Kind : std::uint32_t { kData = 1, kHeartbeat = 2, kHello = 3, kBye = 4 };
constexpr std::uint32_t kControlMagic = 0x43505254;  // "TRPC"
constexpr std::size_t kMaxHello = 64u << 10;
// Connections still proving the token at once; more are closed at accept.
constexpr std::size_t kMaxPending = 256;

struct Header {
  std::uint32_t magic;
  std::uint32_t kind;
  std::uint64_t len;
};

struct Conn {
  enum class State { kAnswer, kHello, kOpen };
  int fd = -1;
  int rank = -1;
  State state = State::kOpen;
  std::string nonce;                       // the hub's challenge, while kAnswer
  std::string got;                         // bytes received and not yet parsed
  Clock::time_point heard = Clock::now();  // the loop's thread only
  std::atomic<Clock::rep> sent{Clock::now().time_since_epoch().count()};  // any sender
  Clock::time_point until = {};
  absl::Status drop_why = absl::OkStatus();  // set by drop() under the hub's mu_
  bool dropping = false;
  std::mutex write_mu;
  bool closed = false;  // guarded by write_mu

  ~Conn() { close(); }
  void close() {
    std::lock_guard<std::mutex> lock(write_mu);
    if (!closed && fd >= 0) ::close(fd);
    closed = true;
  }
  // One whole frame, or an error (the connection is then useless).
  absl::Status send(Kind kind, absl::string_view payload, Clock::time_point deadline) {
    std::string buf(sizeof(Header) + payload.size(), '\0');
    const Header h{kControlMagic, kind, payload.size()};
    std::memcpy(buf.data(), &h, sizeof h);
    if (!payload.empty()) std::memcpy(buf.data() + sizeof h, payload.data(), payload.size());
    std::lock_guard<std::mutex> lock(write_mu);
    if (closed) return absl::UnavailableError("the connection is closed");
    absl::Status st = write_full(fd, buf.data(), buf.size(), deadline);
    if (st.ok()) sent = Clock::now().time_since_epoch().count();
    return st;
  }
  // A heartbeat if the socket takes it at once (never blocks the loop's
  // thread on a peer that does not read): false only when the stream is
  // broken (a partial write).
  bool heartbeat() {
    std::unique_lock<std::mutex> lock(write_mu, std::try_to_lock);
    if (!lock.owns_lock() || closed) return true;  // a frame is being written: as good
    const Header h{kControlMagic, kHeartbeat, 0};
    const ssize_t n = ::send(fd, &h, sizeof h, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof h)) sent = Clock::now().time_since_epoch().count();
    return n < 0 ? errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR
                 : n == static_cast<ssize_t>(sizeof h);
  }
  // Unblocks a writer stuck on this connection, then closes it.
  void cut() {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    close();
  }
  Clock::duration since_sent(Clock::time_point now) const {
    return now - Clock::time_point(Clock::duration(sent.load()));
  }
  // Takes what the socket has, at most `limit` bytes in all (a connection
  // that has not proved the token gets no more than its handshake).
  // Unavailable when the peer closed it.
  absl::Status receive(std::size_t limit = kMaxFrame + 2 * sizeof(Header)) {
    char buf[64 << 10];
    for (;;) {
      if (got.size() >= limit) return absl::OkStatus();
      const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, limit - got.size()), MSG_DONTWAIT);
      if (n > 0) {
        got.append(buf, static_cast<std::size_t>(n));
        heard = Clock::now();
        continue;
      }
      if (n == 0) return absl::UnavailableError("the connection closed");
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      if (errno == EINTR) continue;
      return absl::UnavailableError(std::strerror(errno));
    }
  }
  // The next whole frame from `got`: true with kind and body, false when
  // more bytes are due; an error for a bad header or a frame too long.
  absl::StatusOr<bool> next(std::uint32_t* kind, std::string* body, std::size_t max) {
    auto f = take_control_frame(&got, max);
    if (!f.ok()) return f.status();
    if (!*f) return false;
    *kind = (*f)->kind;
    *body = std::move((*f)->body);
    return true;
  }
};

}  // namespace control_internal

absl::StatusOr<std::optional<ControlFrame>> take_control_frame(std::string* buffer,
                                                               std::size_t max) {
  using control_internal::Header;
  if (buffer->size() < sizeof(Header)) return std::optional<ControlFrame>();
  Header h{};
  std::memcpy(&h, buffer->data(), sizeof h);
  if (h.magic != control_internal::kControlMagic || h.kind < control_internal::kData ||
      h.kind > control_internal::kBye)
    return absl::DataLossError("not a troupe control frame");
  if (h.len > max)
    return absl::DataLossError(absl::StrCat("a frame of ", h.len, " bytes (at most ", max, ")"));
  if (buffer->size() - sizeof h < h.len) return std::optional<ControlFrame>();
  ControlFrame f{h.kind, buffer->substr(sizeof h, h.len)};
  buffer->erase(0, sizeof h + h.len);
  return std::optional<ControlFrame>(std::move(f));
}

namespace {

using control_internal::Clock;
using control_internal::Conn;
using control_internal::Kind;

Clock::time_point after(absl::Duration d) { return Clock::now() + absl::ToChronoNanoseconds(d); }

// fds at the front of the hub's poll: the wake pipe, the TCP listener, the
// local one (-1 where there is none: poll skips it).
constexpr std::size_t kFixedFds = 3;

void default_log(ControlOptions& o) {
  if (!o.log) o.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
}

void drain(int fd) {
  char buf[64];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
}

}  // namespace

// ---- hub ----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ControlHub>> ControlHub::listen(const std::string& host, int port,
                                                               ControlOptions options,
                                                               Handlers handlers) {
  if (options.token.size() < kMinTokenLength)
    return absl::InvalidArgumentError("control channel: a job token is required");
  std::unique_ptr<ControlHub> hub(new ControlHub());
  default_log(options);
  hub->options_ = std::move(options);
  hub->handlers_ = std::move(handlers);
  auto addr = resolve_ipv4(host, port, "control channel");
  if (!addr.ok()) return addr.status();
  hub->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1;
  ::setsockopt(hub->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(hub->listen_fd_, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr) != 0 ||
      ::listen(hub->listen_fd_, 128) != 0) {
    return absl::UnavailableError(absl::StrCat("control channel: cannot listen on ", host, ":",
                                               port, ": ", std::strerror(errno)));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(hub->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  hub->port_ = ntohs(bound.sin_port);
  if (hub->options_.local_socket) {
    // A random name, which no one can take first and which says nothing of
    // the job; without it (a failure logged) the links use TCP.
    absl::StatusOr<std::string> random = new_job_token();
    const std::string name = random.ok() ? absl::StrCat("troupe-", random->substr(0, 32)) : "";
    absl::StatusOr<int> local = random.ok() ? listen_local(name) : random.status();
    if (local.ok()) {
      hub->local_fd_ = *local;
      hub->local_name_ = name;
    } else {
      hub->options_.log(absl::StrCat("troupe control: no local socket (links use TCP): ",
                                     local.status().message()));
    }
  }
  if (::pipe2(hub->wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    return absl::InternalError("control channel: pipe failed");
  hub->thread_ = std::thread([h = hub.get()] { h->loop(); });
  return hub;
}

ControlHub::~ControlHub() {
  stop_ = true;
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  std::map<int, std::shared_ptr<Conn>> ranks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks.swap(ranks_);
  }
  for (auto& [rank, c] : ranks) (void)c->send(Kind::kBye, "", after(absl::Milliseconds(200)));
  ranks.clear();
  pending_.clear();
  for (int fd : {listen_fd_, local_fd_})
    if (fd >= 0) ::close(fd);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

absl::Status ControlHub::send(int rank, absl::string_view frame) {
  if (frame.size() > kMaxFrame)
    return absl::InvalidArgumentError(absl::StrCat("a control frame of ", frame.size(), " bytes"));
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranks_.find(rank);
    if (it == ranks_.end())
      return absl::UnavailableError(
          absl::StrCat(options_.peer_name, " ", rank, " is not connected"));
    c = it->second;
  }
  absl::Status st = c->send(Kind::kData, frame, after(options_.dead_after));
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("control channel to ", options_.peer_name, " ", rank, ": ", st.message()));
  }
  return st;
}

void ControlHub::drop(int rank, absl::Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranks_.find(rank);
    if (it == ranks_.end()) return;
    it->second->dropping = true;
    it->second->drop_why = std::move(why);
  }
  (void)!::write(wake_[1], "x", 1);
}

void ControlHub::lose(int rank, absl::Status why) {
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranks_.find(rank);
    if (it == ranks_.end()) return;
    c = std::move(it->second);
    ranks_.erase(it);
  }
  c->cut();
  if (handlers_.on_lost) handlers_.on_lost(rank, std::move(why));
}

// A connection still proving the token or saying hello: true while it is
// on its way (or has joined), false to refuse it.
bool ControlHub::advance_pending(Conn& c) {
  auto refuse = [&](const std::string& why) {
    options_.log(
        absl::StrCat("troupe control: refused a connection from ", peer_name(c.fd), ": ", why));
    refused_++;
    return false;
  };
  // Only what is due: the answer, then a hello's header, then its body.
  std::size_t due = kAnswerBytes;
  if (c.state == Conn::State::kHello) {
    due = sizeof(control_internal::Header);
    if (c.got.size() >= due) {
      control_internal::Header h{};
      std::memcpy(&h, c.got.data(), sizeof h);
      due += std::min<std::uint64_t>(h.len, control_internal::kMaxHello + 1);
    }
  }
  if (absl::Status st = c.receive(due); !st.ok()) return refuse(std::string(st.message()));
  if (c.state == Conn::State::kAnswer) {
    if (c.got.size() < kAnswerBytes) return true;
    auto proof =
        answer_proof(options_.token, c.nonce, absl::string_view(c.got).substr(0, kAnswerBytes));
    if (!proof.ok())
      return refuse(absl::StrCat("no proof of the job token: ", proof.status().message()));
    if (!write_full(c.fd, proof->data(), proof->size(), c.until).ok())
      return refuse("gone during the handshake");
    c.got.erase(0, kAnswerBytes);
    c.state = Conn::State::kHello;
  }
  std::uint32_t kind = 0;
  std::string body;
  auto whole = c.next(&kind, &body, control_internal::kMaxHello);
  if (!whole.ok()) return refuse(std::string(whole.status().message()));
  if (!*whole) return true;
  if (kind != Kind::kHello || body.size() < 4) return refuse("the first frame is not a hello");
  std::int32_t rank = -1;
  std::memcpy(&rank, body.data(), 4);
  if (rank < 0) return refuse(absl::StrCat("a hello from ", options_.peer_name, " ", rank));
  c.rank = rank;
  c.state = Conn::State::kOpen;
  c.heard = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ranks_.count(rank))
      return refuse(absl::StrCat(options_.peer_name, " ", rank, " is already connected"));
    ranks_[rank] = pending_[c.fd];  // before on_join, which may send() to it
  }
  if (handlers_.on_join && !handlers_.on_join(rank, body.substr(4))) {
    std::lock_guard<std::mutex> lock(mu_);
    ranks_.erase(rank);
    return refuse(absl::StrCat(options_.peer_name, " ", rank, " was not accepted"));
  }
  return true;
}

// New connections on the listeners that have them (TCP's, the local
// socket's): the challenge goes out at once.
void ControlHub::accept_new(bool on_tcp, bool on_local) {
  for (const int listener : {on_tcp ? listen_fd_ : -1, on_local ? local_fd_ : -1}) {
    if (listener < 0) continue;
    for (int i = 0; i < 64; i++) {
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      if (pending_.size() >=
          control_internal::kMaxPending) {  // a flood of connections: refuse the excess
        ::close(fd);
        refused_++;
        continue;
      }
      int one = 1;
      if (listener == listen_fd_) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_shared<Conn>();
      c->fd = fd;
      c->state = Conn::State::kAnswer;
      c->until = after(options_.handshake);
      auto nonce = send_challenge(fd, after(absl::Seconds(1)));
      if (!nonce.ok()) {
        refused_++;
        continue;  // ~Conn closes it
      }
      c->nonce = *nonce;
      pending_[fd] = std::move(c);
    }
  }
}

void ControlHub::loop() {
  gpu::name_this_thread("hub");
  const auto heartbeat = absl::ToChronoNanoseconds(options_.heartbeat);
  const auto dead_after = absl::ToChronoNanoseconds(options_.dead_after);
  while (!stop_) {
    std::vector<std::shared_ptr<Conn>> open;
    std::vector<std::pair<int, absl::Status>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [rank, c] : ranks_) {
        if (c->dropping) {
          dropped.emplace_back(rank, c->drop_why);
        } else {
          open.push_back(c);
        }
      }
    }
    for (auto& [rank, why] : dropped) lose(rank, why);
    const std::array<pollfd, kFixedFds> fixed{
        {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}, {local_fd_, POLLIN, 0}}};
    std::vector<pollfd> fds(fixed.begin(), fixed.end());
    for (auto& [fd, c] : pending_) fds.push_back({fd, POLLIN, 0});
    for (auto& c : open) fds.push_back({c->fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) return;
    if (fds[0].revents) drain(wake_[0]);
    if (stop_) return;
    accept_new(fds[1].revents & POLLIN, fds[2].revents & POLLIN);
    // Handshakes: the pending that were there before this turn's accepts
    // are the first in fds (pending_ is ordered by fd, so take them by fd).
    std::size_t k = kFixedFds;
    std::vector<int> leaving;  // joined (moved to ranks_) or refused (closed with their Conn)
    for (; k < fds.size() - open.size(); k++) {
      auto it = pending_.find(fds[k].fd);
      if (it == pending_.end()) continue;
      Conn& c = *it->second;
      bool keep = fds[k].revents == 0 || advance_pending(c);
      if (keep && c.state != Conn::State::kOpen && Clock::now() > c.until) {
        options_.log(absl::StrCat("troupe control: refused a connection from ", peer_name(c.fd),
                                  ": no hello in time"));
        refused_++;
        keep = false;
      }
      if (!keep || c.state == Conn::State::kOpen)
        leaving.push_back(it->first);  // joined: in ranks_
    }
    for (int fd : leaving) pending_.erase(fd);
    // Frames of joined ranks.
    const auto now = Clock::now();
    for (std::size_t i = 0; i < open.size(); i++) {
      Conn& c = *open[i];
      absl::Status st = fds[k + i].revents ? c.receive() : absl::OkStatus();
      for (;;) {  // frames already here are delivered even when the peer has closed
        std::uint32_t kind = 0;
        std::string body;
        auto whole = c.next(&kind, &body, kMaxFrame);
        if (!whole.ok()) {
          options_.log(absl::StrCat("troupe control: cut off ", options_.peer_name, " ", c.rank,
                                    ": ", whole.status().message()));
          st = whole.status();
          break;
        }
        if (!*whole) break;
        if (kind == Kind::kData && handlers_.on_frame) handlers_.on_frame(c.rank, std::move(body));
        if (kind == Kind::kBye) {
          st = absl::OkStatus();
          lose(c.rank, absl::OkStatus());
          break;
        }
      }
      if (!st.ok()) {
        lose(c.rank, absl::Status(st.code(), absl::StrCat(options_.peer_name, " ", c.rank,
                                                          "'s control channel: ", st.message())));
      } else if (now - c.heard > dead_after) {
        lose(c.rank,
             absl::DeadlineExceededError(absl::StrCat(
                 options_.peer_name, " ", c.rank, " sent nothing for ",
                 absl::FormatDuration(options_.dead_after), " (hung, or its link is cut)")));
      } else if (c.since_sent(now) >= heartbeat && !c.heartbeat()) {
        lose(c.rank, absl::UnavailableError(absl::StrCat(options_.peer_name, " ", c.rank,
                                                         "'s control channel broke mid-frame")));
      }
    }
  }
}

// ---- link ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ControlLink>> ControlLink::connect(
    const std::string& host, int port, int rank, const std::string& hello, ControlOptions options,
    OnFrame on_frame, OnLost on_lost) {
  if (options.token.size() < kMinTokenLength)
    return absl::InvalidArgumentError("control channel: a job token is required");
  if (hello.size() + 4 > control_internal::kMaxHello)
    return absl::InvalidArgumentError("control channel: the hello is too long");
  auto addr = resolve_ipv4(host, port, "control channel");
  if (!addr.ok()) return addr.status();
  default_log(options);
  const auto deadline = after(options.handshake);
  // A hub that is flooded with connections closes new ones at accept (and
  // a wrong token is told the same way): a few attempts, backing off,
  // within the deadline, before the failure is final.
  std::unique_ptr<ControlLink> link;
  auto take = [&](int fd, bool local) {  // a connection that proved the token or not
    link.reset(new ControlLink());
    link->local_ = local;
    link->conn_ = std::make_shared<Conn>();
    link->conn_->fd = fd;
    link->conn_->rank = rank;
  };
  auto drop = [&] {
    link->conn_->close();  // (no goodbye on a connection that never opened)
    link.reset();
  };
  // The hub's local socket first, where we were told its name. Any failure
  // there (nobody listening, a full backlog, a token exchange that fails or
  // takes 2 s: a hub on this host answers in microseconds) is logged, and
  // TCP follows.
  if (options.local_socket && !options.local_name.empty()) {
    absl::StatusOr<int> fd = connect_local(options.local_name);
    absl::Status st = fd.status();
    if (fd.ok()) {
      take(*fd, true);
      st = prove_token(*fd, options.token, std::min(deadline, after(absl::Seconds(2))));
      if (!st.ok()) drop();
    }
    if (!st.ok())
      options.log(absl::StrCat("troupe control: ", options.peer_name, " ", rank,
                               ": the local socket ", options.local_name, ": ", st.message(),
                               "; TCP instead"));
  }
  for (int attempt = 0; link == nullptr; attempt++) {
    auto connected = connect_within(&*addr, deadline);
    if (!connected.ok()) {
      return absl::DeadlineExceededError(absl::StrCat("control channel: ", options.peer_name, " ",
                                                      rank, " cannot reach ", host, ":", port, ": ",
                                                      connected.status().message()));
    }
    take(*connected, false);
    absl::Status st = prove_token(*connected, options.token, deadline);
    if (st.ok()) break;
    drop();
    const auto pause = std::chrono::milliseconds(200 << std::min(attempt, 3));
    if (attempt >= 4 || Clock::now() + pause >= deadline) {
      return absl::Status(st.code(), absl::StrCat("control channel: ", options.peer_name, " ", rank,
                                                  " at ", host, ":", port, ": ", st.message()));
    }
    std::this_thread::sleep_for(pause);
  }
  const int fd = link->conn_->fd;
  std::string payload(4, '\0');
  const std::int32_t r = rank;
  std::memcpy(payload.data(), &r, 4);
  payload += hello;
  if (absl::Status st = link->conn_->send(Kind::kHello, payload, deadline); !st.ok()) {
    drop();
    return st;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  link->options_ = std::move(options);
  link->on_frame_ = std::move(on_frame);
  link->on_lost_ = std::move(on_lost);
  if (::pipe2(link->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    drop();
    return absl::InternalError("control channel: pipe failed");
  }
  link->thread_ = std::thread([l = link.get()] { l->loop(); });
  return link;
}

ControlLink::~ControlLink() {
  if (conn_) (void)conn_->send(Kind::kBye, "", after(absl::Milliseconds(200)));
  stop_ = true;
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  conn_.reset();
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

absl::Status ControlLink::send(absl::string_view frame) {
  if (frame.size() > kMaxFrame)
    return absl::InvalidArgumentError(absl::StrCat("a control frame of ", frame.size(), " bytes"));
  absl::Status st = conn_->send(Kind::kData, frame, after(options_.dead_after));
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("control channel: ", st.message()));
  return st;
}

void ControlLink::loop() {
  gpu::name_this_thread("control");
  const auto heartbeat = absl::ToChronoNanoseconds(options_.heartbeat);
  const auto dead_after = absl::ToChronoNanoseconds(options_.dead_after);
  Conn& c = *conn_;
  auto lost = [&](absl::Status why) {
    c.cut();
    if (on_lost_) on_lost_(std::move(why));
  };
  while (!stop_) {
    pollfd fds[2] = {{wake_[0], POLLIN, 0}, {c.fd, POLLIN, 0}};
    if (::poll(fds, 2, 100) < 0 && errno != EINTR)
      return lost(
          absl::InternalError(absl::StrCat("the control channel: poll: ", std::strerror(errno))));
    if (fds[0].revents) drain(wake_[0]);
    if (stop_) return;
    absl::Status st = fds[1].revents ? c.receive() : absl::OkStatus();
    for (;;) {
      std::uint32_t kind = 0;
      std::string body;
      auto whole = c.next(&kind, &body, kMaxFrame);
      if (!whole.ok()) {
        st = whole.status();
        break;
      }
      if (!*whole) break;
      if (kind == Kind::kData && on_frame_) on_frame_(std::move(body));
      if (kind == Kind::kBye) return lost(absl::OkStatus());
    }
    if (!st.ok())
      return lost(absl::Status(st.code(), absl::StrCat("the control channel: ", st.message())));
    const auto now = Clock::now();
    if (now - c.heard > dead_after) {
      return lost(absl::DeadlineExceededError(
          absl::StrCat("the coordinator sent nothing for ",
                       absl::FormatDuration(options_.dead_after), " (hung, or the link is cut)")));
    }
    if (c.since_sent(now) >= heartbeat && !c.heartbeat())
      return lost(absl::UnavailableError("the control channel broke mid-frame"));
  }
}

}  // namespace troupe::comm
