// A FIFO of callbacks run on one thread of its own: how transports complete
// operations outside the call that posted them.
//
// A callback that throws does not end the process (an exception leaving a
// thread calls std::terminate): the queue keeps the first such error
// (Internal, with what() where it is a std::exception), says it once on
// stderr, and runs the callbacks after it. status() returns that error; an
// owner that can fail what the callback was for (a communicator, a
// transport) passes `on_error` (which must not throw), called on the
// queue's thread with each such error.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu/thread_name.h"

namespace troupe::comm {

class CallbackQueue {
 public:
  using ErrorHandler = std::function<void(const absl::Status&)>;
  // `name`: the thread's (gpu/thread_name.h), a string literal.
  explicit CallbackQueue(const char* name, ErrorHandler on_error = nullptr)
      : name_(name), on_error_(std::move(on_error)), thread_([this] { run(); }) {}
  ~CallbackQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  CallbackQueue(const CallbackQueue&) = delete;
  CallbackQueue& operator=(const CallbackQueue&) = delete;

  // The first exception a callback threw, as Internal (OK if none).
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

  // Returns once every callback posted before the call has run (an owner
  // about to free what they use waits here first). Not from the queue's
  // own thread.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty() && !running_; });
  }

 private:
  void run() {
    gpu::name_this_thread(name_);
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, all delivered
        fn = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      try {
        fn();
      } catch (const std::exception& ex) {
        record(ex.what());
      } catch (...) {
        record("an exception that is not a std::exception");
      }
      fn = nullptr;  // (what it holds goes before drain() returns)
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_ = false;
      }
      idle_.notify_all();
    }
  }

  void record(const std::string& what) {
    const absl::Status st =
        absl::InternalError(absl::StrCat("a completion callback threw: ", what));
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      first = error_.ok();
      if (first) error_ = st;
    }
    if (first) std::fprintf(stderr, "troupe: %s\n", std::string(st.message()).c_str());
    if (on_error_) on_error_(st);  // on this thread, outside the lock
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_;  // drain(): nothing queued or running
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  bool running_ = false;
  absl::Status error_;
  const char* name_;
  ErrorHandler on_error_;
  std::thread thread_;  // last: it runs as soon as it is made
};

}  // namespace troupe::comm
