// Deadline-bounded socket I/O; see comm/socket_io.h.
#include "comm/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace troupe::comm {

int ms_left(SteadyTime deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
          .count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

absl::Status wait_fd(int fd, short events, SteadyTime deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(std::strerror(errno));
    if (n == 0) return absl::DeadlineExceededError("timed out");
    return absl::OkStatus();
  }
}

absl::Status write_full(int fd, const void* p, std::size_t n, SteadyTime deadline) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    if (absl::Status st = wait_fd(fd, POLLOUT, deadline); !st.ok()) return st;
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return absl::UnavailableError("the connection closed");
    c += w;
    n -= static_cast<std::size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status read_full(int fd, void* p, std::size_t n, SteadyTime deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    if (absl::Status st = wait_fd(fd, POLLIN, deadline); !st.ok()) return st;
    const ssize_t r = ::recv(fd, c, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return absl::UnavailableError("the connection closed");
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<sockaddr_in> resolve_ipv4(const std::string& host, int port, absl::string_view who) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(who, ": unknown host ", host));
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return addr;
}

absl::StatusOr<int> connect_within(const void* addr, SteadyTime deadline) {
  int last = ETIMEDOUT;
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("socket: ", std::strerror(errno)));
    int err = 0;
    if (::connect(fd, static_cast<const sockaddr*>(addr), sizeof(sockaddr_in)) != 0) {
      err = errno;
      if (err == EINPROGRESS && wait_fd(fd, POLLOUT, deadline).ok()) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else if (err == EINPROGRESS) {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    ::close(fd);
    last = err;
    if (std::chrono::steady_clock::now() >= deadline)
      return absl::DeadlineExceededError(std::strerror(last));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {

// (An abstract name: a NUL, then the name, no terminator counted.)
absl::StatusOr<std::pair<sockaddr_un, socklen_t>> abstract_address(const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof a.sun_path)
    return absl::InvalidArgumentError(
        absl::StrCat("a local socket name of ", name.size(), " bytes"));
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  return std::make_pair(a,
                        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size()));
}

}  // namespace

absl::StatusOr<int> listen_local(const std::string& name) {
  auto addr = abstract_address(name);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("socket: ", std::strerror(errno)));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0 ||
      ::listen(fd, 128) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("local socket ", name, ": ", std::strerror(err)));
  }
  return fd;
}

absl::StatusOr<int> connect_local(const std::string& name) {
  auto addr = abstract_address(name);
  if (!addr.ok()) return addr.status();
  // Non-blocking: a listener whose backlog is full answers EAGAIN at once
  // instead of keeping the caller waiting with no deadline.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("socket: ", std::strerror(errno)));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == ECONNREFUSED || err == ENOENT)
      return absl::NotFoundError(absl::StrCat("no local socket ", name));
    return absl::UnavailableError(absl::StrCat("local socket ", name, ": ", std::strerror(err)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string peer_name(int fd) {
  sockaddr_storage any{};
  socklen_t any_len = sizeof any;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&any), &any_len) == 0 &&
      any.ss_family == AF_UNIX) {
    ucred who{};
    socklen_t who_len = sizeof who;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &who, &who_len) == 0)
      return absl::StrCat("pid ", who.pid, " (uid ", who.uid, ") on the local socket");
    return "the local socket";
  }
  sockaddr_in a{};
  socklen_t len = sizeof a;
  char ip[INET_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return absl::StrCat(ip, ":", ntohs(a.sin_port));
}

}  // namespace troupe::comm
