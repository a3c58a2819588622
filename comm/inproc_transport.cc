// In-process transport: matching tables per destination, one copy per message.
#include "comm/inproc_transport.h"

#include <cstring>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"

namespace troupe::comm {

class InProcTransport final : public Transport {
 public:
  InProcTransport(std::shared_ptr<InProcFabric> fabric, int rank)
      : fabric_(std::move(fabric)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  // (One process: every route is the same.)
  void send(int peer, Tag tag, const void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token, Route /*route*/ = Route::kAny) override {
    fabric_->send(rank_, peer, tag, data, bytes, std::move(done), std::move(token), driving());
  }
  void recv(int peer, Tag tag, void* data, std::size_t bytes, Callback done,
            std::shared_ptr<CancelToken> token, Route /*route*/ = Route::kAny) override {
    fabric_->recv(rank_, peer, tag, data, bytes, std::move(done), std::move(token), driving());
  }
  void recv_pull(int peer, Tag tag, std::size_t bytes, void* /*landing*/, ArrivalCallback done,
                 std::shared_ptr<CancelToken> token, Route /*route*/ = Route::kAny) override {
    fabric_->recv_pull(rank_, peer, tag, bytes, std::move(done), std::move(token), driving());
  }
  void fail_peer(int peer, absl::Status why) override {
    fabric_->fail_peer(rank_, peer, std::move(why));
  }
  void cancel(const std::shared_ptr<CancelToken>& token, absl::Status why) override {
    fabric_->cancel(rank_, token, std::move(why));
  }

  bool shares_memory_with(int peer) const override {
    return fabric_->shares_memory() && peer != rank_;
  }
  bool can_poll() const override { return true; }
  bool poll() override {
    std::shared_ptr<Driver> d = driving();
    if (!d) return false;
    std::deque<std::function<void()>> ready;
    {
      std::lock_guard<std::mutex> lock(d->mu);
      ready.swap(d->pending);
    }
    for (auto& fn : ready) fabric_->run_inline(fn);
    return !ready.empty();
  }
  bool wait_for_event(std::chrono::microseconds max) override {
    std::shared_ptr<Driver> d = driving();
    if (!d) return false;
    std::unique_lock<std::mutex> lock(d->mu);
    d->sleeping = true;
    d->cv.wait_for(lock, max, [&] { return !d->pending.empty(); });
    d->sleeping = false;
    return true;
  }
  void drive_begin() override {
    std::shared_ptr<Driver> d = driving();
    if (!d) {
      d = std::make_shared<Driver>();
      drives().push_back({this, d});
    }
    std::lock_guard<std::mutex> lock(d->mu);
    d->depth++;
  }
  // The last drive_end runs what is left (nothing else would).
  void drive_end() override {
    std::shared_ptr<Driver> d = driving();
    if (!d) return;
    std::deque<std::function<void()>> left;
    {
      std::lock_guard<std::mutex> lock(d->mu);
      if (--d->depth > 0) return;
      left.swap(d->pending);
    }
    std::erase_if(drives(), [this](const Drive& x) { return x.endpoint == this; });
    for (auto& fn : left) fabric_->run_inline(fn);
  }

 private:
  using Driver = InProcFabric::Driver;
  struct Drive {
    const InProcTransport* endpoint;
    std::shared_ptr<Driver> driver;
  };
  // The endpoints this thread drives.
  static std::vector<Drive>& drives() {
    thread_local std::vector<Drive> v;
    return v;
  }
  std::shared_ptr<Driver> driving() const {
    for (const Drive& x : drives())
      if (x.endpoint == this) return x.driver;
    return nullptr;
  }

  std::shared_ptr<InProcFabric> fabric_;
  int rank_;
};

InProcFabric::InProcFabric(int size)
    : size_(size),
      sends_(static_cast<std::size_t>(size)),
      recvs_(static_cast<std::size_t>(size)),
      failed_(static_cast<std::size_t>(size),
              std::vector<absl::Status>(static_cast<std::size_t>(size))) {}

std::unique_ptr<Transport> InProcFabric::endpoint(int rank) {
  return std::make_unique<InProcTransport>(shared_from_this(), rank);
}

void InProcFabric::complete(const std::shared_ptr<Driver>& driver, std::function<void()> fn,
                            bool here) {
  if (driver) {
    std::lock_guard<std::mutex> lock(driver->mu);
    if (driver->depth > 0) {
      driver->pending.push_back(std::move(fn));
      if (driver->sleeping) driver->cv.notify_one();
      return;
    }
  }
  if (here) {
    run_inline(fn);
  } else {
    callbacks_.post(std::move(fn));
  }
}

void InProcFabric::deliver(Op send, Op recv, bool send_posted_last) {
  if (send.bytes != recv.bytes) {
    absl::Status st = absl::InvalidArgumentError(
        absl::StrCat("message of ", send.bytes, " bytes from rank ", send.owner, " to rank ",
                     recv.owner, " for a receive of ", recv.bytes, " bytes (tag ", send.tag, ")"));
    complete(
        send.driver, [s = std::move(send.done), st] { s(st); }, false);
    complete(
        recv.driver, [r = std::move(recv.done), st] { r(st); }, false);
    return;
  }
  if (recv.pulled) {
    // Nothing is copied: the receiver reads the sender's buffer, and the
    // send completes when it lets go (through the queue: a receiver that
    // lets go at once must not complete the send inside its sender's call).
    auto arrival = std::make_shared<Arrival>(
        absl::OkStatus(), send.bytes,
        std::make_unique<InPlaceSource>(send.data, [this, driver = send.driver,
                                                    d = std::move(send.done)](absl::Status st) {
          complete(
              driver,
              [d, st = std::move(st)] {
                d(st.ok() ? st : absl::Status(st.code(), absl::StrCat("receiver: ", st.message())));
              },
              false);
        }));
    auto run = [pulled = std::move(recv.pulled), arrival] { (*pulled)(std::move(*arrival)); };
    // The receiver has been waiting: its callback runs here.
    complete(recv.driver, std::move(run), send_posted_last && send.owner != recv.owner);
    return;
  }
  if (send.bytes > 0) std::memcpy(recv.data, send.data, send.bytes);
  // The poster's own completion goes through the queue (never inside its
  // call), or waits for its driver's poll. The other side, a peer that has been waiting, completes
  // right here: one thread handoff less on the path of every pipeline message.
  Op& poster = send_posted_last ? send : recv;
  Op& waiter = send_posted_last ? recv : send;
  complete(
      poster.driver, [d = std::move(poster.done)] { d(absl::OkStatus()); }, false);
  complete(
      waiter.driver, [d = std::move(waiter.done)] { d(absl::OkStatus()); },
      waiter.owner != poster.owner);
}

// Why `op` cannot be posted (caller holds mu_): no such peer, the peer has
// failed, or its communicator was cancelled. OK if it can.
absl::Status InProcFabric::refusal(const Op& op) const {
  if (op.peer < 0 || op.peer >= size_)
    return absl::InvalidArgumentError(absl::StrCat("no rank ", op.peer));
  const absl::Status& failed =
      failed_[static_cast<std::size_t>(op.owner)][static_cast<std::size_t>(op.peer)];
  if (!failed.ok()) return failed;
  if (op.token && op.token->cancelled) {
    return absl::CancelledError("operation posted after its communicator was cancelled");
  }
  return absl::OkStatus();
}

// Posts `op` into `mine` (by destination) unless `theirs` already holds its
// match; `is_send` says which side `op` is.
void InProcFabric::post(Op op, bool is_send) {
  const int dst = is_send ? op.peer : op.owner, src = is_send ? op.owner : op.peer;
  std::unique_lock<std::mutex> lock(mu_);
  if (absl::Status st = refusal(op); !st.ok()) {
    lock.unlock();
    complete(
        op.driver, [d = std::move(op.done), st] { d(st); }, false);
    return;
  }
  auto& table = (is_send ? recvs_ : sends_)[static_cast<std::size_t>(dst)];  // where a match waits
  if (auto it = table.find({src, op.tag}); it != table.end()) {
    Op match = std::move(it->second.front());
    it->second.erase(it->second.begin());
    if (it->second.empty()) table.erase(it);  // tags are not reused: keep the tables bounded
    lock.unlock();
    if (is_send) {
      deliver(std::move(op), std::move(match), true);
    } else {
      deliver(std::move(match), std::move(op), false);
    }
    return;
  }
  (is_send ? sends_ : recvs_)[static_cast<std::size_t>(dst)][{src, op.tag}].push_back(
      std::move(op));
}

void InProcFabric::send(int src, int dst, Tag tag, const void* data, std::size_t bytes,
                        Callback done, std::shared_ptr<CancelToken> token,
                        std::shared_ptr<Driver> driver) {
  post({src, dst, tag, const_cast<void*>(data), bytes, std::move(done), std::move(token), nullptr,
        std::move(driver)},
       true);
}

void InProcFabric::recv(int dst, int src, Tag tag, void* data, std::size_t bytes, Callback done,
                        std::shared_ptr<CancelToken> token, std::shared_ptr<Driver> driver) {
  post({dst, src, tag, data, bytes, std::move(done), std::move(token), nullptr, std::move(driver)},
       false);
}

void InProcFabric::recv_pull(int dst, int src, Tag tag, std::size_t bytes, ArrivalCallback done,
                             std::shared_ptr<CancelToken> token, std::shared_ptr<Driver> driver) {
  auto pulled = std::make_shared<ArrivalCallback>(std::move(done));
  Callback failed = [pulled, bytes](absl::Status st) { (*pulled)(Arrival(st, bytes, nullptr)); };
  post({dst, src, tag, nullptr, bytes, std::move(failed), std::move(token), std::move(pulled),
        std::move(driver)},
       false);
}

std::size_t InProcFabric::pending_entries() {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const auto& table : sends_) n += table.size();
  for (const auto& table : recvs_) n += table.size();
  return n;
}

template <typename Pred>
void InProcFabric::fail_where(int rank, Pred pred, const absl::Status& why) {
  std::vector<std::pair<std::shared_ptr<Driver>, Callback>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto sweep = [&](std::map<Key, std::vector<Op>>& table) {
      for (auto entry = table.begin(); entry != table.end();) {
        std::erase_if(entry->second, [&](Op& op) {
          if (op.owner != rank || !pred(op)) return false;
          failed.emplace_back(op.driver, std::move(op.done));
          return true;
        });
        entry = entry->second.empty() ? table.erase(entry) : std::next(entry);
      }
    };
    for (auto& table : recvs_) sweep(table);
    for (auto& table : sends_) sweep(table);
  }
  for (auto& [owner, cb] : failed)
    complete(
        owner, [cb = std::move(cb), why] { cb(why); }, false);
}

void InProcFabric::run_inline(const std::function<void()>& fn) {
  std::string what;
  try {
    fn();
    return;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  fail_everything(absl::InternalError(absl::StrCat("a completion callback threw: ", what)));
}

void InProcFabric::fail_everything(const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& row : failed_)
      for (auto& f : row)
        if (f.ok()) f = why;
  }
  for (int r = 0; r < size_; r++)
    fail_where(
        r, [](const Op&) { return true; }, why);
}

void InProcFabric::fail_peer(int rank, int peer, absl::Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(peer)] = why;
  }
  fail_where(
      rank, [peer](const Op& op) { return op.peer == peer; }, why);
}

void InProcFabric::cancel(int rank, const std::shared_ptr<CancelToken>& token, absl::Status why) {
  if (!token) return;
  token->cancelled = true;
  fail_where(
      rank, [&token](const Op& op) { return op.token == token; }, why);
}

}  // namespace troupe::comm
