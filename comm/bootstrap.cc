// TCP bootstrap: rendezvous at rank 0, blob all-gather, liveness by socket.
// Every read and write has a deadline; see comm/bootstrap.h.
#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/auth.h"
#include "comm/socket_io.h"
#include "comm/ucx_transport.h"

namespace troupe::comm {
namespace {

using Clock = std::chrono::steady_clock;

enum MsgType : std::uint32_t { kHello = 1, kTable = 2, kDead = 3, kFin = 4, kFinAck = 5 };
constexpr std::uint32_t kBootstrapMagic = 0x42505254;  // "TRPB"
// Payloads are worker addresses and their table: far below this.
constexpr std::uint64_t kMaxPayload = 64u << 20;
// How long a new connection has to say its hello.
constexpr auto kHelloBound = std::chrono::seconds(2);

struct Header {
  std::uint32_t magic;
  std::uint32_t type;
  std::int32_t rank;
  std::uint32_t pad;
  std::uint64_t len;
};

absl::Status send_msg(int fd, MsgType type, int rank, Clock::time_point deadline,
                      const std::string& payload = "") {
  Header h{kBootstrapMagic, type, rank, 0, payload.size()};
  absl::Status st = write_full(fd, &h, sizeof h, deadline);
  return st.ok() ? write_full(fd, payload.data(), payload.size(), deadline) : st;
}

absl::Status recv_msg(int fd, Header* h, std::string* payload, Clock::time_point deadline) {
  if (absl::Status st = read_full(fd, h, sizeof *h, deadline); !st.ok()) return st;
  if (h->magic != kBootstrapMagic) return absl::DataLossError("not a troupe bootstrap message");
  if (h->len > kMaxPayload)
    return absl::DataLossError(
        absl::StrCat("a message of ", h->len, " bytes (at most ", kMaxPayload, ")"));
  payload->resize(h->len);
  return read_full(fd, payload->data(), h->len, deadline);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string rank_list(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Bootstrap>> Bootstrap::start(int rank, int size,
                                                            const std::string& host, int port,
                                                            absl::Duration timeout,
                                                            Options options) {
  if (size < 1 || rank < 0 || rank >= size)
    return absl::InvalidArgumentError(absl::StrCat("bootstrap: rank ", rank, " of ", size));
  std::unique_ptr<Bootstrap> b(new Bootstrap());
  b->rank_ = rank;
  b->size_ = size;
  b->timeout_ = timeout;
  b->token_ = std::move(options.token);
  b->log_ = options.log ? std::move(options.log) : [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
  };
  b->dead_.assign(static_cast<std::size_t>(size), false);
  b->fin_.assign(static_cast<std::size_t>(size), false);
  if (::pipe2(b->wake_, O_CLOEXEC) != 0) return absl::InternalError("bootstrap: pipe failed");
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(timeout);
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
    b->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(b->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(b->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(b->listen_fd_, std::max(size, 16)) != 0) {
      return absl::UnavailableError(absl::StrCat("bootstrap: cannot listen on ", host, ":", port,
                                                 ": ", std::strerror(errno)));
    }
    if (absl::Status st = b->accept_ranks(deadline); !st.ok()) return st;
    return b;
  }
  auto connected = connect_within(&addr, deadline);
  if (!connected.ok()) {
    return absl::DeadlineExceededError(absl::StrCat("bootstrap: rank ", rank,
                                                    " cannot reach rank 0 at ", host, ":", port,
                                                    ": ", connected.status().message()));
  }
  const int fd = *connected;
  set_nodelay(fd);
  b->fds_ = {fd};
  if (!b->token_.empty()) {
    if (absl::Status st = prove_token(fd, b->token_, deadline); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("bootstrap: rank ", rank, " at rank 0 (", host,
                                                  ":", port, "): ", st.message()));
    }
  }
  if (absl::Status st = send_msg(fd, kHello, rank, deadline); !st.ok())
    return absl::UnavailableError(absl::StrCat("bootstrap: hello to rank 0: ", st.message()));
  return b;
}

// Rank 0: accepts until every other rank has said a valid hello. New
// connections wait in `pending`, each with kHelloBound to prove the job
// token (if any) and say its hello; their bytes are taken as they come, so
// one that is silent or slow holds nobody up. A bad one is closed and logged.
namespace {
struct Pending {
  int fd;
  Clock::time_point until;
  std::string nonce;  // the job-token challenge sent at accept ("" without a token)
  std::string got;    // bytes received so far
  bool proved;
};
}  // namespace

absl::Status Bootstrap::accept_ranks(Clock::time_point deadline) {
  fds_.assign(static_cast<std::size_t>(size_), -1);
  std::vector<Pending> pending;
  auto refuse = [&](int fd, const std::string& why) {
    log_(absl::StrCat("troupe bootstrap: refused a connection from ", peer_name(fd), ": ", why));
    ::close(fd);
    refused_++;
  };
  // What `p` has sent so far: OK and *rank set when its hello is complete,
  // OK with *rank -1 while more is due, an error to refuse it.
  auto advance = [&](Pending& p, int* rank) -> absl::Status {
    *rank = -1;
    // Never more than the handshake and the hello: what a rank sends next
    // (its address, for all_gather) stays in the socket.
    char buf[kAnswerBytes + sizeof(Header)];
    const std::size_t want = (p.proved ? sizeof(Header) : kAnswerBytes) - p.got.size();
    const ssize_t n = ::recv(p.fd, buf, want, MSG_DONTWAIT);
    if (n == 0) return absl::UnavailableError("closed before its hello");
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return absl::OkStatus();
      return absl::UnavailableError(std::strerror(errno));
    }
    p.got.append(buf, static_cast<std::size_t>(n));
    if (!p.proved && p.got.size() >= kAnswerBytes) {
      auto proof = answer_proof(token_, p.nonce, absl::string_view(p.got).substr(0, kAnswerBytes));
      if (!proof.ok())
        return absl::PermissionDeniedError(
            absl::StrCat("no proof of the job token: ", proof.status().message()));
      if (absl::Status st = write_full(p.fd, proof->data(), proof->size(), p.until); !st.ok())
        return st;
      p.got.erase(0, kAnswerBytes);
      p.proved = true;
    }
    if (!p.proved || p.got.size() < sizeof(Header)) return absl::OkStatus();
    Header h{};
    std::memcpy(&h, p.got.data(), sizeof h);
    if (h.magic != kBootstrapMagic || h.type != kHello || h.len != 0 || h.rank <= 0 ||
        h.rank >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad hello (type ", h.type, ", rank ", h.rank, " of ", size_, ")"));
    }
    if (fds_[static_cast<std::size_t>(h.rank)] != -1)
      return absl::AlreadyExistsError(absl::StrCat("rank ", h.rank, " has already arrived"));
    *rank = h.rank;
    return absl::OkStatus();
  };
  int arrived = 1;
  while (arrived < size_) {
    if (Clock::now() >= deadline) {
      for (const Pending& p : pending) ::close(p.fd);
      std::vector<int> missing;
      for (int r = 1; r < size_; r++)
        if (fds_[static_cast<std::size_t>(r)] < 0) missing.push_back(r);
      return absl::DeadlineExceededError(
          absl::StrCat("bootstrap: only ", arrived, " of ", size_, " ranks arrived within ",
                       absl::FormatDuration(timeout_), "; missing ", rank_list(missing)));
    }
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    Clock::time_point wake = deadline;
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      wake = std::min(wake, p.until);
    }
    if (::poll(fds.data(), fds.size(), std::max(ms_left(wake), 1)) < 0 && errno != EINTR) {
      for (const Pending& p : pending) ::close(p.fd);
      return absl::InternalError(absl::StrCat("bootstrap: poll: ", std::strerror(errno)));
    }
    std::vector<Pending> still;
    for (std::size_t i = 1; i < fds.size(); i++) {
      Pending& p = pending[i - 1];
      int rank = -1;
      absl::Status st = fds[i].revents != 0 ? advance(p, &rank) : absl::OkStatus();
      if (st.ok() && rank < 0 && Clock::now() >= p.until)
        st = absl::DeadlineExceededError("no complete hello within 2 s");
      if (!st.ok()) {
        refuse(p.fd, std::string(st.message()));
      } else if (rank < 0) {
        still.push_back(std::move(p));
      } else {
        set_nodelay(p.fd);
        fds_[static_cast<std::size_t>(rank)] = p.fd;
        arrived++;
      }
    }
    pending = std::move(still);
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const auto until = std::min(Clock::now() + kHelloBound, deadline);
      Pending p{fd, until, "", "", token_.empty()};
      if (!token_.empty()) {
        auto nonce = send_challenge(fd, until);
        if (!nonce.ok()) {
          refuse(fd, absl::StrCat("no proof of the job token: ", nonce.status().message()));
          continue;
        }
        p.nonce = *nonce;
      }
      pending.push_back(std::move(p));
    }
  }
  for (const Pending& p : pending) refuse(p.fd, "every rank had arrived");
  return absl::OkStatus();
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

// Rank 0 reads from every rank at once, so that the error names each rank
// still silent at the deadline (alive but stuck) or gone.
absl::Status Bootstrap::gather(std::vector<int> from, std::uint32_t type,
                               std::vector<std::string>* got, absl::string_view what) {
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(timeout_);
  while (!from.empty()) {
    std::vector<pollfd> fds;
    for (int r : from) fds.push_back({fds_[static_cast<std::size_t>(r)], POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), ms_left(deadline));
    if (n < 0 && errno != EINTR)
      return absl::InternalError(absl::StrCat("bootstrap: poll: ", std::strerror(errno)));
    if (n == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("bootstrap: ", rank_list(from), " sent no ", what, " within ",
                       absl::FormatDuration(timeout_), " (alive but not taking part?)"));
    }
    std::vector<int> left;
    for (std::size_t i = 0; i < fds.size(); i++) {
      const int r = from[i];
      if (fds[i].revents == 0) {
        left.push_back(r);
        continue;
      }
      Header h{};
      std::string payload;
      absl::Status st = recv_msg(fds[i].fd, &h, &payload, deadline);
      if (!st.ok())
        return absl::UnavailableError(
            absl::StrCat("bootstrap: rank ", r, " during the ", what, ": ", st.message()));
      if (h.type != type) {  // not what we wait for: keep waiting
        left.push_back(r);
        continue;
      }
      if (got != nullptr) (*got)[static_cast<std::size_t>(r)] = std::move(payload);
    }
    from = std::move(left);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Bootstrap::all_gather(const std::string& mine) {
  std::vector<std::string> all(static_cast<std::size_t>(size_));
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(timeout_);
  if (rank_ == 0) {
    all[0] = mine;
    std::vector<int> from;
    for (int r = 1; r < size_; r++) from.push_back(r);
    if (absl::Status st = gather(from, kHello, &all, "address"); !st.ok()) return st;
    std::string table;
    for (const auto& s : all) {
      const std::uint64_t n = s.size();
      table.append(reinterpret_cast<const char*>(&n), 8);
      table += s;
    }
    for (int r = 1; r < size_; r++) {
      absl::Status st = send_msg(fds_[static_cast<std::size_t>(r)], kTable, 0, deadline, table);
      if (!st.ok())
        return absl::UnavailableError(
            absl::StrCat("bootstrap: rank ", r, " during the exchange: ", st.message()));
    }
    return all;
  }
  Header h{};
  std::string table;
  absl::Status st = send_msg(fds_[0], kHello, rank_, deadline, mine);
  if (st.ok()) st = recv_msg(fds_[0], &h, &table, deadline);
  if (st.ok() && h.type != kTable) st = absl::DataLossError("an unexpected message");
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("bootstrap: rank ", rank_,
                                                " waiting for rank 0's address "
                                                "table: ",
                                                st.message()));
  }
  std::size_t pos = 0;
  for (auto& s : all) {
    std::uint64_t n = 0;
    if (pos + 8 > table.size()) return absl::DataLossError("bootstrap: short table");
    std::memcpy(&n, table.data() + pos, 8);
    pos += 8;
    if (n > table.size() - pos) return absl::DataLossError("bootstrap: short table");
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
      const auto deadline = Clock::now() + std::chrono::seconds(1);
      for (int k = 1; k < size_; k++) {
        const int fd = fds_[static_cast<std::size_t>(k)];
        if (k != r && fd >= 0) (void)send_msg(fd, kDead, r, deadline);
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
      // A message has begun: the rest of it is due at once (a rank that
      // stalls mid-message is as good as dead to the others).
      absl::Status st =
          recv_msg(fds[i].fd, &h, &payload, Clock::now() + absl::ToChronoNanoseconds(timeout_));
      if (!st.ok()) {
        if (finishing_) return;
        declare(peer,
                rank_ == 0
                    ? absl::StrCat("rank ", peer, " died (its bootstrap connection: ", st.message(),
                                   ")")
                    : absl::StrCat("rank 0 died (the bootstrap connection: ", st.message(), ")"));
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
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(timeout_);
  if (rank_ == 0) {
    std::vector<int> from;
    for (int r = 1; r < size_; r++) {
      const auto i = static_cast<std::size_t>(r);
      if (!dead_[i] && !fin_[i] && fds_[i] >= 0) from.push_back(r);
    }
    absl::Status st = gather(from, kFin, nullptr, "finish");
    for (int r = 1; r < size_; r++) {
      const int fd = fds_[static_cast<std::size_t>(r)];
      if (fd >= 0 && !dead_[static_cast<std::size_t>(r)]) (void)send_msg(fd, kFinAck, 0, deadline);
    }
    return st;
  }
  if (absl::Status st = send_msg(fds_[0], kFin, rank_, deadline); !st.ok())
    return absl::UnavailableError(absl::StrCat("bootstrap: rank 0 is gone: ", st.message()));
  for (;;) {
    Header h{};
    std::string payload;
    absl::Status st = recv_msg(fds_[0], &h, &payload, deadline);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("bootstrap: rank ", rank_,
                                                  " waiting for rank 0's finish: ", st.message()));
    }
    if (h.type == kFinAck) return absl::OkStatus();
  }
}

absl::StatusOr<UcxWorld> connect_ucx(int rank, int size, const std::string& host, int port,
                                     absl::Duration timeout, Bootstrap::Options options,
                                     UcxOptions ucx) {
  UcxWorld w;
  auto b = Bootstrap::start(rank, size, host, port, timeout, std::move(options));
  if (!b.ok()) return b.status();
  w.bootstrap = std::move(*b);
  auto t = UcxTransport::create(rank, size, ucx);
  if (!t.ok()) return t.status();
  w.transport = std::move(*t);
  auto addresses = w.bootstrap->all_gather(w.transport->address());
  if (!addresses.ok()) return addresses.status();
  absl::Status st = w.transport->connect(*addresses);
  if (!st.ok()) return st;
  return w;
}

}  // namespace troupe::comm
