// UcxTransport's progress: one pass over the worker, the caller-driven
// progress of drive_begin/poll/drive_end, the sleep on the worker's event
// descriptor, and the progress thread (comm/ucx_transport.h).
#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "comm/ucx_internal.h"
#include "comm/ucx_transport.h"
#include "gpu/thread_name.h"

namespace troupe::comm {

using ucx_internal::in_progress;
using ucx_internal::InProgress;

// One pass of progress: posts what callers queued, runs the callbacks of
// operations failed outside UCX (cancelling their requests), polls the
// worker. The caller holds worker_mu_. Returns whether anything happened;
// `*idle` is set when nothing at all is pending.
bool UcxTransport::progress_once(bool* idle) {
  auto* worker = static_cast<ucp_worker_h>(worker_);
  std::vector<Op*> queued;
  std::vector<std::unique_ptr<Op>> failed;
  std::vector<std::pair<std::unique_ptr<Op>, absl::Status>> completed;
  std::vector<void*> cancel;
  {
    std::unique_lock<std::mutex> lock(mu_);
    queued.swap(to_post_);
    completed.swap(to_complete_);  // while a caller posted
    // Operations failed outside UCX (fail_peer, cancel, refused posts).
    for (Op* op : to_fail_) {
      auto it = ops_.find(op);
      if (it == ops_.end()) continue;
      if (op->in_ucx) {
        // UCX still holds it: cancel; report now (dead peer) or when UCX
        // lets go of the buffer (deferred, bounded by give_up_at). An
        // operation held on cancel stays posted until it completes or the
        // bound passes.
        const bool hold = op->wait_for_ucx && op->hold_on_cancel && !op->peer_dead;
        if (!hold && op->request != nullptr && !op->ucx_cancelled) {
          cancel.push_back(op->request);
          op->ucx_cancelled = true;  // once: a second cancel could touch a freed request
        }
        op->cancel_sent = true;
        if (op->wait_for_ucx) {
          op->give_up_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
          deferred_.push_back(op);
          continue;
        }
        op->callback_taken = true;
        failed.push_back(std::make_unique<Op>(
            Op{this, op->peer, op->is_send, op->bytes, std::move(op->done), nullptr}));
      } else {
        failed.push_back(std::move(it->second));
        ops_.erase(it);
      }
    }
    to_fail_.clear();
    // Deferred cancellations that UCX has not finished within the bound.
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(deferred_, [&](Op* op) {
      if (ops_.count(op) == 0) return true;  // completed by UCX and reported
      if (op->callback_taken || (now < op->give_up_at && !op->peer_dead)) return false;
      if (op->request != nullptr && !op->ucx_cancelled) {
        cancel.push_back(op->request);
        op->ucx_cancelled = true;
      }
      op->callback_taken = true;
      failed.push_back(std::make_unique<Op>(
          Op{this, op->peer, op->is_send, op->bytes, std::move(op->done), nullptr}));
      return true;
    });
    *idle = ops_.empty() && queued.empty() && failed.empty() && completed.empty();
    if (*idle) return false;
  }
  for (auto& [op, st] : completed) complete(op->done, std::move(st));
  // Cancels first: a post may progress UCX, which could complete (and
  // free) a request collected above.
  for (void* req : cancel) ucp_request_cancel(worker, req);
  post_queued(queued);
  for (auto& op : failed) complete(op->done, absl::OkStatus());  // wrapped: reports the failure
  return ucp_worker_progress(worker) != 0 || !queued.empty() || !failed.empty() ||
         !completed.empty();
}

bool UcxTransport::poll() {
  if (in_progress) return false;
  std::unique_lock<std::mutex> lock(worker_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // another thread is progressing
  InProgress mark;
  bool idle = false;
  return progress_once(&idle);
}

// Arms the worker's event descriptor and sleeps on it: woken by the next
// message (UCX's shared-memory and TCP transports signal an armed worker),
// or after `max`. Where ranks outnumber cores this lets a rank that waits
// give its core to one that works, and be woken the moment its message comes,
// where polling would wait for the scheduler to come round.
bool UcxTransport::wait_for_event(std::chrono::microseconds max) {
  if (event_fd_ < 0 || wake_fd_ < 0 || in_progress) return false;
  {
    // Another thread progressing will complete what we wait for and tell us
    // (false: the caller sleeps on its own condition variable). The worker
    // stays ours until we are counted asleep: a caller posting its own
    // operation (post_here) in between would not know to wake us.
    std::unique_lock<std::mutex> worker(worker_mu_, std::try_to_lock);
    if (!worker.owns_lock()) return false;
    const ucs_status_t st = ucp_worker_arm(static_cast<ucp_worker_h>(worker_));
    if (st == UCS_ERR_BUSY) return true;  // events to progress first
    if (st != UCS_OK) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (work_queued_locked()) return true;  // work of our own
    sleepers_++;  // from here on submit() and fail_where() wake us through wake_fd_
  }
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  const auto us = std::min<std::int64_t>(max.count(), 999999);
  const timespec timeout{0, static_cast<long>(us) * 1000};
  ::ppoll(fds, 2, &timeout, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    sleepers_--;
    std::uint64_t drained = 0;
    if (fds[1].revents & POLLIN) (void)!::read(wake_fd_, &drained, sizeof drained);
  }
  return true;
}

// Caller holds mu_: wakes whoever needs to see new work (the progress
// thread, or a driver asleep in wait_for_event).
void UcxTransport::wake_locked() {
  if (sleepers_ > 0) {  // a driver, or the progress thread, asleep on the event fd
    const std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (drivers_ == 0) cv_.notify_all();
}

void UcxTransport::drive_begin() {
  ucx_internal::driving().push_back(this);
  std::lock_guard<std::mutex> lock(mu_);
  drivers_++;
}

// The progress thread takes over only if something is still in flight: a
// collective that just ended usually leaves nothing but its last
// acknowledgements, which the poll below hands to UCX (waking the progress
// thread after every collective cost ~10 us of context switches on this core).
void UcxTransport::drive_end() {
  poll();
  auto& mine = ucx_internal::driving();
  if (auto it = std::find(mine.rbegin(), mine.rend(), this); it != mine.rend()) {
    mine.erase(std::next(it).base());
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drivers_--;
    if (work_queued_locked()) {
      // What this thread submitted unannounced and its polls could not post
      // (another thread had the worker): whoever sleeps must see it.
      wake_locked();
    } else {
      wake = drivers_ == 0 && !ops_.empty();
    }
  }
  if (wake) cv_.notify_all();
}

// Polls without an event before the progress thread sleeps on the event fd,
// each followed by a yield. 800 since 2026-12-07 (a worker process on one
// CAF worker): six alternating invocations of bench/hop_bench.py --only
// hops --sizes 4096 on a 2-core Intel Xeon put the slope across at 54.4-66.1
// us (median 59.3) against 60.0-68.9 (66.6) with 200, lower in 5 of the 6
// pairs; 50 gave 59.9-71.8 and 2000 57.5-72.8 (three each). cpu-small pp 2
// through troupe launch stayed at 1.002x the in-process run (0.995 with
// 200).
constexpr int kQuietPolls = 800;

void UcxTransport::progress_loop() {
  gpu::name_this_thread("ucx");
  int quiet = 0;
  for (;;) {
    {
      // Stand down while callers drive progress themselves.
      std::unique_lock<std::mutex> lock(mu_);
      if (drivers_ != 0) {
        cv_.wait(lock, [&] { return stop_ || drivers_ == 0; });
        quiet = 0;
      }
    }
    bool idle = false, moved = false;
    {
      std::lock_guard<std::mutex> lock(worker_mu_);
      InProgress mark;
      moved = progress_once(&idle);
    }
    if (stop_) return;
    if (idle) {
      std::unique_lock<std::mutex> lock(mu_);
      // (An operation a caller posted since is in ops_, not queued.)
      if (ops_.empty() && !work_queued_locked() && !stop_) {
        cv_.wait_for(lock, std::chrono::milliseconds(100));  // idle: no core burnt
      }
      continue;
    }
    if (moved) {
      quiet = 0;
      continue;
    }
    // In flight but quiet: poll on for a moment, yielding the core to
    // whoever wants it (the next message of a pipeline usually follows
    // within microseconds); then sleep on UCX's event descriptor until a
    // message arrives or new operations are queued (wake_fd_). Polling on
    // through a long wait -- a compute phase of hundreds of ms with receives
    // posted -- took a core's share from the compute threads of every
    // process on the host (scripts/bench launch: 0.88 of the in-process
    // speed at cpu-small pp=2 with yield-polling for 10 ms, then every 50 us).
    if (++quiet < kQuietPolls) {
      std::this_thread::yield();
    } else if (!wait_for_event(std::chrono::milliseconds(5))) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!work_queued_locked()) cv_.wait_for(lock, std::chrono::microseconds(50));
    }
  }
}

}  // namespace troupe::comm
