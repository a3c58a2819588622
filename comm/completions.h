// How a collective's thread waits for its transport operations: the
// results of a fixed set of them, each waited for while this thread drives
// the transport's progress (where it can), as the Communicator's steps and
// its shared memory setup do.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "comm/transport.h"

namespace troupe::comm {

// Waits until `ready()` (checked under `lock`): asleep on `cv`, or, with a
// `driver`, making it progress on this thread: polling (yielding the core
// between polls) for the first kSpin, then sleeping until the transport has
// an event (a message came) between polls, or, where it has no event
// descriptor, polling every 50 us.
template <typename Ready>
void await(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Transport* driver,
           Ready ready) {
  if (driver == nullptr) return cv.wait(lock, ready);
  constexpr auto kSpin = std::chrono::microseconds(50);
  auto quiet_since = std::chrono::steady_clock::now();
  while (!ready()) {
    lock.unlock();
    const bool moved = driver->poll();
    const auto now = std::chrono::steady_clock::now();
    if (moved) quiet_since = now;
    bool slept = false;
    if (!moved && now - quiet_since >= kSpin) {
      slept = driver->wait_for_event(std::chrono::milliseconds(1));
    } else if (!moved) {
      std::this_thread::yield();
    }
    lock.lock();
    if (!moved && !slept && now - quiet_since >= kSpin && !ready()) {
      cv.wait_for(lock, std::chrono::microseconds(50));
    }
  }
}

// The results of a fixed set of transport operations (a Status each, or an
// Arrival for pulled receives), each waited for by the collective's thread.
// The state is shared with the callbacks, so a callback still inside
// notify_all() when the waiter returns touches live memory (a regression
// found by ThreadSanitizer).
template <typename T>
class Results {
 public:
  Results(std::size_t n, Transport* driver) : state_(std::make_shared<State>(n)), driver_(driver) {}
  std::size_t size() const { return state_->done.size(); }
  std::function<void(T)> callback(std::size_t i) {
    return [state = state_, i](T result) {
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->result[i] = std::move(result);
        state->done[i] = true;
      }
      state->cv.notify_all();
    };
  }
  T wait(std::size_t i) {
    std::unique_lock<std::mutex> lock(state_->mu);
    await(lock, state_->cv, driver_, [&] { return state_->done[i]; });
    if constexpr (std::is_copy_constructible_v<T>) {
      return state_->result[i];
    } else {
      return std::move(state_->result[i]);  // an Arrival is taken once
    }
  }

 private:
  struct State {
    explicit State(std::size_t n) : result(n), done(n, false) {}
    std::mutex mu;
    std::condition_variable cv;
    std::vector<T> result;
    std::vector<bool> done;
  };
  std::shared_ptr<State> state_;
  Transport* driver_;
};
using Completions = Results<absl::Status>;
using Arrivals = Results<Arrival>;

// Waits for every operation; the first error, if any. `on_error` runs at
// the first error (the communicator fails, cancelling the others).
inline absl::Status wait_all(Completions& ops,
                             const std::function<void(const absl::Status&)>& on_error = nullptr) {
  absl::Status first;
  for (std::size_t i = 0; i < ops.size(); i++) {
    absl::Status st = ops.wait(i);
    if (first.ok() && !st.ok()) {
      first = st;
      if (on_error) on_error(st);
    }
  }
  return first;
}

}  // namespace troupe::comm
