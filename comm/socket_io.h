// Reads and writes of whole buffers on a stream socket (TCP, or a local
// one), each bounded by a deadline: what the bootstrap, the job-token
// handshake and the control channel are built on, so that no peer can
// stall a reader for ever.
//
//   auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
//   RETURN_IF_ERROR(comm::write_full(fd, &header, sizeof header, deadline));
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe::comm {

using SteadyTime = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline` (0 once it has passed).
int ms_left(SteadyTime deadline);
// Waits until `fd` is ready for `events` (POLLIN, POLLOUT): OK,
// DeadlineExceeded, or Unavailable.
absl::Status wait_fd(int fd, short events, SteadyTime deadline);
// All `n` bytes, or DeadlineExceeded / Unavailable ("the connection closed").
absl::Status write_full(int fd, const void* p, std::size_t n, SteadyTime deadline);
absl::Status read_full(int fd, void* p, std::size_t n, SteadyTime deadline);
// host (an IPv4 address or a name) and port as a sockaddr_in;
// InvalidArgument "WHO: unknown host H" where it has none.
absl::StatusOr<sockaddr_in> resolve_ipv4(const std::string& host, int port, absl::string_view who);
// A TCP connection to `addr` (a sockaddr_in), made within `deadline`,
// retrying while nobody listens yet: the fd (blocking, CLOEXEC,
// TCP_NODELAY), or DeadlineExceeded with the last error. A blackholed host
// costs the deadline, not the kernel's two minutes of SYN retries.
absl::StatusOr<int> connect_within(const void* addr, SteadyTime deadline);
// A stream socket in the abstract Unix namespace (Linux: no file, no
// permissions, gone with the socket; seen by the processes of this network
// namespace and no other, so not from another host or a container with a
// network of its own): listening (non-blocking, CLOEXEC), or
// connected (blocking, CLOEXEC). connect_local does not wait: NotFound
// where nobody listens under `name` here, Unavailable where the listener's
// backlog is full.
absl::StatusOr<int> listen_local(const std::string& name);
absl::StatusOr<int> connect_local(const std::string& name);
// "ip:port" of the other end, or its pid and uid on a local socket, for
// messages.
std::string peer_name(int fd);

}  // namespace troupe::comm
