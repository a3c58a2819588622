// A TCP port on 127.0.0.1 that nothing listens on or connects from now, as
// the kernel picks it (bind to port 0): tests that need a fixed port for
// their ranks to meet at. A port computed from the pid could fall in the
// ephemeral range, where another process's connection may hold it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace troupe::testing {

inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_tcp_port: no socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("free_tcp_port: bind to port 0 failed");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace troupe::testing
