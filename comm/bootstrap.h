// A minimal bootstrap and liveness check over TCP, for tests and benchmarks
// until the launcher carries both over CAF.
//
// Rank 0 listens; every other rank connects (retrying until the timeout).
// all_gather() exchanges one blob per rank (UCX worker addresses). The
// connections then stay open as a liveness check: when a rank's process
// dies, the kernel closes its socket, rank 0 sees it and tells the others;
// if rank 0 dies, the others see their socket close. Each rank's on_dead
// callback runs once per dead rank, typically calling fail_peer() and
// aborting the communicators that contain it. A rank that is done calls
// finish(), a barrier after which closing is not a death.
//
// Every blocking call is bounded by the timeout given to start() and fails
// with an error naming the ranks it waited for (DeadlineExceeded for a rank
// that is alive but silent, Unavailable for one that left). A connection to
// rank 0 that does not say a valid hello in time (a stray client, another
// job's rank, a port scanner) is closed and logged, and the rendezvous goes
// on without it. With a job token, a connection that cannot prove it is
// refused the same way.
//
//   auto b = comm::Bootstrap::start(rank, size, "127.0.0.1", 29500, absl::Seconds(30));
//   auto addresses = (*b)->all_gather(transport->address());
//   (*b)->watch([&](int dead, absl::Status why) { ... });
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/ucx_transport.h"

namespace troupe::comm {

class Bootstrap {
 public:
  using Log = std::function<void(const std::string&)>;
  struct Options {
    // The job token (comm/auth.h): when set, every connection to rank 0
    // proves it before its hello is read, and rank 0 proves it back.
    std::string token = {};
    Log log = nullptr;  // hears of refused connections (default: standard error)
  };
  static absl::StatusOr<std::unique_ptr<Bootstrap>> start(int rank, int size,
                                                          const std::string& host, int port,
                                                          absl::Duration timeout, Options options);
  static absl::StatusOr<std::unique_ptr<Bootstrap>> start(int rank, int size,
                                                          const std::string& host, int port,
                                                          absl::Duration timeout) {
    return start(rank, size, host, port, timeout, Options{});
  }
  ~Bootstrap();
  // Connections rank 0 refused (a bad or missing hello) during start().
  int refused_connections() const { return refused_; }

  absl::StatusOr<std::vector<std::string>> all_gather(const std::string& mine);
  // Starts the liveness check; `on_dead(rank, why)` runs on its thread.
  void watch(std::function<void(int, absl::Status)> on_dead);
  // Barrier of every rank's finish(); after it, closing is not a failure.
  absl::Status finish();

 private:
  Bootstrap() = default;
  void watch_loop();
  absl::Status accept_ranks(std::chrono::steady_clock::time_point deadline);
  // Rank 0: one message of `type` from each rank in `from`, by the deadline.
  absl::Status gather(std::vector<int> from, std::uint32_t type, std::vector<std::string>* got,
                      absl::string_view what);

  int rank_ = 0, size_ = 0;
  absl::Duration timeout_;
  std::string token_;
  Log log_;
  int refused_ = 0;
  int listen_fd_ = -1;
  std::vector<int> fds_;  // rank 0: one per other rank; others: fds_[0] to rank 0
  std::function<void(int, absl::Status)> on_dead_;
  std::vector<bool> dead_;
  std::vector<bool> fin_;  // rank 0: ranks whose finish() has begun
  std::mutex mu_;
  std::atomic<bool> finishing_{false};
  int wake_[2] = {-1, -1};
  std::thread watcher_;
};

// A rank's UCX transport connected to every other rank through a bootstrap
// at host:port (rank 0 listens there). The bootstrap stays for liveness
// (watch) and the final barrier (finish).
struct UcxWorld {
  std::unique_ptr<Bootstrap> bootstrap;
  std::unique_ptr<UcxTransport> transport;
};
absl::StatusOr<UcxWorld> connect_ucx(int rank, int size, const std::string& host, int port,
                                     absl::Duration timeout, Bootstrap::Options options = {},
                                     UcxOptions ucx = {});

}  // namespace troupe::comm
