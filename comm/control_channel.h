// troupe's control channel: TCP (or local socket) connections between the
// process that hosts the coordinator (the hub) and every worker process (a
// link each), carrying length-prefixed frames of at most kMaxFrame bytes.
// The actors layer puts one serialized CAF message in each frame (the
// launcher and its agents, JSON); tensors never travel here.
//
// Every connection proves the job token first (comm/auth.h, the hub proves
// it back) and then says a hello (its rank and a payload); a connection
// that does anything else -- junk, an absurd length, silence -- is closed
// and logged, and the hub goes on. A frame longer than kMaxFrame cuts that
// peer off; nothing a peer sends can crash or stall the hub. The token
// authenticates the connection, not each frame (no per-frame MAC): an
// attacker who can inject into the TCP stream could inject frames.
//
// A process on the hub's host can reach it through the hub's local socket
// instead of loopback TCP, with the same handshake: told its name
// (ControlHub::local_name) by whoever started it there (`troupe launch`).
// A link that cannot use it takes TCP.
//
// Liveness: each end sends a heartbeat every `heartbeat`; an end that hears
// nothing (no frame, no heartbeat) from the other for `dead_after` drops the
// connection with DeadlineExceeded -- a hung process or a cut link, told
// apart from a dead one (its socket closes at once: Unavailable). A link
// that is destroyed says goodbye first, so the hub hears OK, not a loss.
//
//   auto hub = comm::ControlHub::listen("0.0.0.0", 0, {.token = t}, handlers);
//   auto link = comm::ControlLink::connect(addr, (*hub)->port(), rank, "", {.token = t},
//                                          on_frame, on_lost);
//   (*link)->send(bytes);            // -> handlers.on_frame(rank, bytes) on the hub
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace troupe::comm {

// Control messages are small (the largest, a stall report, is a few KiB).
constexpr std::size_t kMaxFrame = 16u << 20;

struct ControlOptions {
  std::string token = {};  // the job token; required (no unauthenticated channel)
  absl::Duration heartbeat = absl::Seconds(1);
  absl::Duration dead_after = absl::Seconds(5);
  absl::Duration handshake = absl::Seconds(5);            // to prove the token and say hello
  std::function<void(const std::string&)> log = nullptr;  // refusals (default: stderr)
  std::string peer_name = "rank";  // what the hub's messages call a peer ("agent 1 sent nothing")
  // Hub: also listen on a local socket (comm/socket_io.h), under a random
  // name (ControlHub::local_name; "" where that failed, logged). Link: that
  // name, given where the hub is on this host; tried before TCP, and TCP
  // where it fails (nobody there, a full backlog, a token exchange that
  // fails or takes 2 s; logged). False on a link: TCP only. A frame's write
  // over loopback TCP runs the receiver's side of the stack too
  // (docs/RUNTIME_COST.md).
  bool local_socket = true;
  std::string local_name = {};
};

namespace control_internal {
struct Conn;
}

// One frame taken off the front of `buffer` (what a connection has
// received): nullopt while more bytes are due; DataLoss for a header that is
// not ours or a frame longer than `max`. Exposed for tests and fuzzing.
struct ControlFrame {
  std::uint32_t kind;  // 1 data, 2 heartbeat, 3 hello, 4 goodbye
  std::string body;
};
absl::StatusOr<std::optional<ControlFrame>> take_control_frame(std::string* buffer,
                                                               std::size_t max);

class ControlHub {
 public:
  struct Handlers {
    // Rank `rank` has proved the token and said `hello`. False refuses it
    // (e.g. that rank is already connected).
    std::function<bool(int rank, const std::string& hello)> on_join;
    std::function<void(int rank, std::string frame)> on_frame;
    // Once per joined rank: OK when it said goodbye, else why it was lost.
    std::function<void(int rank, absl::Status why)> on_lost;
  };
  // Listens on host:port (port 0: any free one, see port()). Handlers run
  // on the hub's thread, one at a time, with no lock held: they may send().
  static absl::StatusOr<std::unique_ptr<ControlHub>> listen(const std::string& host, int port,
                                                            ControlOptions options,
                                                            Handlers handlers);
  ~ControlHub();  // closes every connection; no handler runs after it returns
  int port() const { return port_; }
  // The local socket's name, "" where there is none: for the links of
  // processes on this host (ControlOptions::local_name).
  const std::string& local_name() const { return local_name_; }
  // Any thread. Unavailable if `rank` is not connected (or is lost while
  // the frame is written: the write is bounded by dead_after).
  absl::Status send(int rank, absl::string_view frame);
  // Closes rank's connection; its on_lost runs with `why`.
  void drop(int rank, absl::Status why);
  int refused_connections() const { return refused_.load(); }

 private:
  ControlHub() = default;
  void loop();
  void accept_new(bool on_tcp, bool on_local);
  bool advance_pending(control_internal::Conn& c);  // false: refuse it
  void lose(int rank, absl::Status why);

  ControlOptions options_;
  Handlers handlers_;
  int listen_fd_ = -1, local_fd_ = -1, port_ = 0;  // TCP's listener; the local socket's (or -1)
  std::string local_name_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::mutex mu_;
  std::map<int, std::shared_ptr<control_internal::Conn>> ranks_;    // joined (mu_)
  std::map<int, std::shared_ptr<control_internal::Conn>> pending_;  // by fd, hub thread only
  std::thread thread_;
};

class ControlLink {
 public:
  using OnFrame = std::function<void(std::string frame)>;
  using OnLost = std::function<void(absl::Status why)>;
  // Connects to the hub (retrying until options.handshake has passed),
  // proves the token, checks the hub's proof, says hello. Callbacks run on
  // the link's thread.
  static absl::StatusOr<std::unique_ptr<ControlLink>> connect(const std::string& host, int port,
                                                              int rank, const std::string& hello,
                                                              ControlOptions options,
                                                              OnFrame on_frame, OnLost on_lost);
  ~ControlLink();                              // says goodbye; no callback runs after it returns
  absl::Status send(absl::string_view frame);  // any thread
  // Whether it reached the hub through its local socket (else TCP).
  bool local() const { return local_; }

 private:
  ControlLink() = default;
  void loop();

  bool local_ = false;
  ControlOptions options_;
  OnFrame on_frame_;
  OnLost on_lost_;
  std::shared_ptr<control_internal::Conn> conn_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace troupe::comm
