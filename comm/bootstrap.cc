// TCP bootstrap: rendezvous at rank 0, blob all-gather, liveness by socket.
#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/ucx_transport.h"

namespace troupe::comm {
namespace {

enum MsgType : std::uint32_t { kHello = 1, kTable = 2, kDead = 3, kFin = 4, kFinAck = 5 };

struct Header {
  std::uint32_t type;
  std::int32_t rank;
  std::uint64_t len;
};

bool write_full(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_full(int fd, void* p, std::size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool send_msg(int fd, MsgType type, int rank, const std::string& payload = "") {
  Header h{type, rank, payload.size()};
  return write_full(fd, &h, sizeof h) && write_full(fd, payload.data(), payload.size());
}

bool recv_msg(int fd, Header* h, std::string* payload) {
  if (!read_full(fd, h, sizeof *h) || h->len > (1u << 30)) return false;
  payload->resize(h->len);
  return read_full(fd, payload->data(), h->len);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Bootstrap>> Bootstrap::start(int rank, int size,
                                                            const std::string& host, int port,
                                                            absl::Duration timeout) {
  std::unique_ptr<Bootstrap> b(new Bootstrap());
  b->rank_ = rank;
  b->size_ = size;
  b->dead_.assign(static_cast<std::size_t>(size), false);
  b->fin_.assign(static_cast<std::size_t>(size), false);
  if (::pipe(b->wake_) != 0) return absl::InternalError("bootstrap: pipe failed");
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    hostent* he = ::gethostbyname(host.c_str());
    if (he == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("bootstrap: unknown host ", host));
    std::memcpy(&addr.sin_addr, he->h_addr_list[0], sizeof addr.sin_addr);
  }
  if (rank == 0) {
    b->listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(b->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(b->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(b->listen_fd_, size) != 0) {
      return absl::UnavailableError(absl::StrCat("bootstrap: cannot listen on ", host, ":", port,
                                                 ": ", std::strerror(errno)));
    }
    b->fds_.assign(static_cast<std::size_t>(size), -1);
    for (int k = 1; k < size; k++) {
      pollfd p{b->listen_fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        return absl::DeadlineExceededError(
            absl::StrCat("bootstrap: only ", k, " of ", size, " ranks arrived within the timeout"));
      }
      const int fd = ::accept(b->listen_fd_, nullptr, nullptr);
      Header h{};
      std::string payload;
      if (fd < 0 || !recv_msg(fd, &h, &payload) || h.type != kHello || h.rank <= 0 ||
          h.rank >= size || b->fds_[static_cast<std::size_t>(h.rank)] != -1) {
        return absl::UnavailableError("bootstrap: a bad hello from a connecting rank");
      }
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      b->fds_[static_cast<std::size_t>(h.rank)] = fd;
    }
  } else {
    int fd = -1;
    for (;;) {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
      ::close(fd);
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("bootstrap: rank ", rank, " cannot reach rank 0 at ", host, ":", port));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!send_msg(fd, kHello, rank)) return absl::UnavailableError("bootstrap: hello failed");
    b->fds_ = {fd};
  }
  return b;
}

Bootstrap::~Bootstrap() {
  if (watcher_.joinable()) {
    finishing_ = true;
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
    watcher_.join();
  }
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

absl::StatusOr<std::vector<std::string>> Bootstrap::all_gather(const std::string& mine) {
  std::vector<std::string> all(static_cast<std::size_t>(size_));
  if (rank_ == 0) {
    all[0] = mine;
    for (int r = 1; r < size_; r++) {
      Header h{};
      if (!recv_msg(fds_[static_cast<std::size_t>(r)], &h, &all[static_cast<std::size_t>(r)]) ||
          h.type != kHello) {
        return absl::UnavailableError(
            absl::StrCat("bootstrap: rank ", r, " left during the exchange"));
      }
    }
    std::string table;
    for (const auto& s : all) {
      const std::uint64_t n = s.size();
      table.append(reinterpret_cast<const char*>(&n), 8);
      table += s;
    }
    for (int r = 1; r < size_; r++) {
      if (!send_msg(fds_[static_cast<std::size_t>(r)], kTable, 0, table)) {
        return absl::UnavailableError(
            absl::StrCat("bootstrap: rank ", r, " left during the exchange"));
      }
    }
    return all;
  }
  Header h{};
  std::string table;
  if (!send_msg(fds_[0], kHello, rank_, mine) || !recv_msg(fds_[0], &h, &table) ||
      h.type != kTable) {
    return absl::UnavailableError("bootstrap: rank 0 left during the exchange");
  }
  std::size_t pos = 0;
  for (auto& s : all) {
    std::uint64_t n = 0;
    if (pos + 8 > table.size()) return absl::DataLossError("bootstrap: short table");
    std::memcpy(&n, table.data() + pos, 8);
    pos += 8;
    s = table.substr(pos, n);
    pos += n;
  }
  return all;
}

void Bootstrap::watch(std::function<void(int, absl::Status)> on_dead) {
  on_dead_ = std::move(on_dead);
  watcher_ = std::thread([this] { watch_loop(); });
}

void Bootstrap::watch_loop() {
  auto declare = [&](int r, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead_[static_cast<std::size_t>(r)]) return;
      dead_[static_cast<std::size_t>(r)] = true;
    }
    if (rank_ == 0) {
      for (int k = 1; k < size_; k++) {
        const int fd = fds_[static_cast<std::size_t>(k)];
        if (k != r && fd >= 0) send_msg(fd, kDead, r);
      }
    }
    if (on_dead_) on_dead_(r, absl::UnavailableError(why));
  };
  for (;;) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
    std::vector<int> who{-1};
    for (std::size_t i = 0; i < fds_.size(); i++) {
      if (fds_[i] < 0 || (rank_ == 0 && (dead_[i] || fin_[i]))) continue;
      fds.push_back({fds_[i], POLLIN, 0});
      who.push_back(rank_ == 0 ? static_cast<int>(i) : 0);
    }
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0 || finishing_) return;
    for (std::size_t i = 1; i < fds.size(); i++) {
      if (fds[i].revents == 0) continue;
      Header h{};
      std::string payload;
      const int peer = who[i];
      if (!recv_msg(fds[i].fd, &h, &payload)) {
        if (finishing_) return;
        declare(peer, rank_ == 0
                          ? absl::StrCat("rank ", peer, " died (its bootstrap connection closed)")
                          : "rank 0 died (the bootstrap connection closed)");
        if (rank_ != 0) return;
        continue;
      }
      if (h.type == kDead)
        declare(h.rank, absl::StrCat("rank ", h.rank, " died (reported by rank 0)"));
      if (h.type == kFin && rank_ == 0) {
        // Rank `peer` is done and waits for the barrier in finish(); its
        // socket closing from now on is not a death (a regression: this
        // message was once dropped here and finish() waited for it forever).
        std::lock_guard<std::mutex> lock(mu_);
        fin_[static_cast<std::size_t>(peer)] = true;
      }
    }
  }
}

absl::Status Bootstrap::finish() {
  if (watcher_.joinable()) {
    finishing_ = true;
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
    watcher_.join();
  }
  if (rank_ == 0) {
    for (int r = 1; r < size_; r++) {
      const int fd = fds_[static_cast<std::size_t>(r)];
      if (dead_[static_cast<std::size_t>(r)] || fin_[static_cast<std::size_t>(r)] || fd < 0)
        continue;
      Header h{};
      std::string payload;
      while (recv_msg(fd, &h, &payload) && h.type != kFin) {
      }
    }
    for (int r = 1; r < size_; r++) {
      const int fd = fds_[static_cast<std::size_t>(r)];
      if (fd >= 0 && !dead_[static_cast<std::size_t>(r)]) send_msg(fd, kFinAck, 0);
    }
    return absl::OkStatus();
  }
  if (!send_msg(fds_[0], kFin, rank_)) return absl::UnavailableError("bootstrap: rank 0 is gone");
  Header h{};
  std::string payload;
  while (recv_msg(fds_[0], &h, &payload)) {
    if (h.type == kFinAck) return absl::OkStatus();
  }
  return absl::UnavailableError("bootstrap: rank 0 is gone");
}

absl::StatusOr<UcxWorld> connect_ucx(int rank, int size, const std::string& host, int port,
                                     absl::Duration timeout) {
  UcxWorld w;
  auto b = Bootstrap::start(rank, size, host, port, timeout);
  if (!b.ok()) return b.status();
  w.bootstrap = std::move(*b);
  auto t = UcxTransport::create(rank, size);
  if (!t.ok()) return t.status();
  w.transport = std::move(*t);
  auto addresses = w.bootstrap->all_gather(w.transport->address());
  if (!addresses.ok()) return addresses.status();
  absl::Status st = w.transport->connect(*addresses);
  if (!st.ok()) return st;
  return w;
}

}  // namespace troupe::comm
