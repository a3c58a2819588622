// Ring, halving-doubling, direct and chain collectives on transport
// messages, and the queue that runs them in issue order (the calls that
// choose among them: communicator_calls.cc).
#include "comm/communicator.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "comm/add_into.h"
#include "comm/completions.h"
#include "comm/shm_all_reduce.h"

namespace troupe::comm {

std::pair<std::size_t, std::size_t> chunk_range(std::size_t n, int p, int i) {
  const std::size_t P = static_cast<std::size_t>(p), I = static_cast<std::size_t>(i);
  const std::size_t base = n / P, extra = n % P;
  const std::size_t begin = I * base + std::min(I, extra);
  return {begin, begin + base + (I < extra ? 1 : 0)};
}

namespace {

// Slice length (floats) of one message of `count` floats: at most 4096
// slices (the tag's slice field). Sender and receiver both derive it from
// that message's length alone, so they always agree (a regression: it was
// once computed from max(send, receive) of one side).
std::size_t slice_for(std::size_t count, std::size_t slice_bytes) {
  return std::max<std::size_t>({slice_bytes / sizeof(float), (count + 4095) / 4096, 1});
}

}  // namespace

struct Communicator::StepSends {
  std::uint32_t step;
  Completions done;
};

Communicator::Communicator(Transport& transport, std::vector<int> ranks, GroupKind kind,
                           CommunicatorOptions options)
    : transport_(transport), ranks_(std::move(ranks)), kind_(kind), options_(options) {
  for (std::size_t i = 0; i < ranks_.size(); i++) {
    if (ranks_[i] == transport_.rank()) me_ = static_cast<int>(i);
  }
  if (me_ < 0) aborted_ = absl::InvalidArgumentError("communicator: this rank is not a member");
}

Communicator::~Communicator() = default;  // worker_ (declared last) drains and joins first

bool Communicator::contains(int global_rank) const {
  return std::find(ranks_.begin(), ranks_.end(), global_rank) != ranks_.end();
}

void Communicator::fail(absl::Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.ok()) return;
    aborted_ = why;
    if (shm_ != nullptr) shm_->fail_all(why);  // the other members' waits end too
  }
  transport_.cancel(token_, std::move(why));
}

// Collectives run one at a time (run_mu_), in issue order: on the worker,
// or, for a synchronous call with nothing queued ahead of it, right on the
// caller's thread (no handoff to the worker and back). A failed one fails
// the communicator (its peers are left mid-algorithm); every later one
// reports that root cause rather than a "cancelled".
absl::Status Communicator::execute(const Body& run) {
  std::lock_guard<std::mutex> running(run_mu_);
  // Where the transport lets this thread drive its progress, it does, for
  // the whole collective: no handoff between UCX's thread and this one.
  driver_ = transport_.can_poll() ? &transport_ : nullptr;
  absl::Status st;
  {
    DriveScope drive(driver_);
    st = failure();
    if (st.ok()) st = run();
    if (!st.ok()) fail(st);                                    // cancels the sends still in flight
    if (absl::Status sent = wait_sends(); st.ok()) st = sent;  // their buffers are the caller's
    if (!st.ok()) fail(st);
    if (absl::Status root = failure(); !root.ok()) st = root;
  }
  driver_ = nullptr;
  route_ = Route::kAny;
  next_op_++;
  return st;
}

void Communicator::enqueue(Body run, Callback done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_++;
  }
  worker_.post([this, run = std::move(run), done = std::move(done)] {
    absl::Status st = execute(run);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_--;
    }
    done(st);
  });
}

absl::Status Communicator::run_now(Body run) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (queued_ == 0) {
      queued_++;  // later calls queue behind this one
      lock.unlock();
      absl::Status st = execute(run);
      lock.lock();
      queued_--;
      return st;
    }
  }
  auto promise = std::make_shared<std::promise<absl::Status>>();
  auto result = promise->get_future();
  enqueue(std::move(run), [promise](absl::Status st) { promise->set_value(std::move(st)); });
  return result.get();
}

absl::Status Communicator::failure() {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

// Sends are posted first (the bytes stay put until the peer reads them,
// where it can and route_ is not Route::kCopies), then each received slice
// is pulled and combined as it comes: read in pieces of
// options_.read_piece_bytes and added while in cache, read straight into
// place, or used in place (in-process). The sends are not waited for here:
// the rings write their buffers again only after the sends of step
// `written_after` (of an earlier exchange) are done, and every collective
// waits for all of them before it completes.
absl::Status Communicator::exchange(int to, const float* send, std::size_t n, int from, float* dest,
                                    std::size_t m, Combine how, std::uint32_t op,
                                    std::uint32_t step, int written_after) {
  const std::size_t rslice = slice_for(m, options_.slice_bytes),
                    sslice = slice_for(n, options_.slice_bytes);
  const std::size_t n_recv = (m + rslice - 1) / rslice, n_send = (n + sslice - 1) / sslice;
  const int me_global = ranks_[static_cast<std::size_t>(me_)];
  const int from_global = ranks_[static_cast<std::size_t>(from)];
  const int to_global = ranks_[static_cast<std::size_t>(to)];
  if (how == Combine::kAdd && scratch_.size() < m) scratch_.resize(m);
  if (n_send > 0) {
    sends_.push_back(std::make_unique<StepSends>(StepSends{step, Completions(n_send, driver_)}));
    Completions& sends = sends_.back()->done;
    for (std::size_t s = 0; s < n_send; s++) {
      const std::size_t off = s * sslice, cnt = std::min(sslice, n - off);
      transport_.send(to_global,
                      collective_tag(static_cast<std::uint32_t>(me_global), kind_, op, step,
                                     static_cast<std::uint32_t>(s)),
                      send + off, cnt * sizeof(float), sends.callback(s), token_, route_);
    }
  }
  // The receives may write `dest` (where bytes land rather than wait to be
  // read): first, the sends that read it must be done.
  if (written_after >= 0) {
    if (absl::Status st = wait_sends(static_cast<std::uint32_t>(written_after)); !st.ok())
      return st;
  }
  Arrivals recvs(n_recv, driver_);
  for (std::size_t s = 0; s < n_recv; s++) {
    const std::size_t off = s * rslice, cnt = std::min(rslice, m - off);
    float* landing = (how == Combine::kAdd ? scratch_.data() : dest) + off;
    transport_.recv_pull(from_global,
                         collective_tag(static_cast<std::uint32_t>(from_global), kind_, op, step,
                                        static_cast<std::uint32_t>(s)),
                         cnt * sizeof(float), landing, recvs.callback(s), token_, route_);
  }
  const std::size_t piece = std::max<std::size_t>(options_.read_piece_bytes / sizeof(float), 1);
  if (how == Combine::kAdd && piece_.size() < std::min(piece, m)) piece_.resize(std::min(piece, m));
  absl::Status first;
  for (std::size_t s = 0; s < n_recv; s++) {
    const std::size_t off = s * rslice, cnt = std::min(rslice, m - off);
    Arrival message = recvs.wait(s);
    absl::Status st = message.status();
    if (st.ok() && first.ok()) {
      float* out = dest + off;
      const auto* in = static_cast<const float*>(message.data());
      // Piece by piece, polling the transport between pieces when this
      // thread drives it (the peer's descriptors and acknowledgements keep
      // moving while we copy).
      for (std::size_t p = 0; st.ok() && p < cnt; p += piece) {
        const std::size_t k = std::min(piece, cnt - p);
        if (in != nullptr) {  // readable in place
          if (how == Combine::kAdd) {
            add_into(out + p, in + p, k);
          } else if (in != out) {
            std::memcpy(out + p, in + p, k * sizeof(float));
          }
        } else if (how == Combine::kAdd) {
          st = message.read(p * sizeof(float), piece_.data(), k * sizeof(float));
          if (st.ok()) add_into(out + p, piece_.data(), k);
        } else {
          st = message.read(p * sizeof(float), out + p, k * sizeof(float));
        }
        if (driver_ != nullptr) driver_->poll();
      }
    }
    // Let go of the sender's bytes first, then fail (which cancels the rest,
    // so the waits below return).
    const bool failing = !st.ok() && first.ok();
    message.release(first.ok() && st.ok() ? absl::OkStatus()
                                          : absl::CancelledError("collective aborted"));
    if (failing) {
      first = st;
      fail(st);
    }
  }
  return first;
}

// Waits for the sends of steps <= `step` (all of them by default).
absl::Status Communicator::wait_sends(std::uint32_t step) {
  absl::Status first;
  while (!sends_.empty() && sends_.front()->step <= step) {
    absl::Status st = wait_all(sends_.front()->done, [this](const absl::Status& e) { fail(e); });
    if (first.ok()) first = st;
    sends_.pop_front();
  }
  return first;
}

// After p-1 steps member i holds the full sum of chunk i. At step k it sends
// chunk (i-k-1) to member i+1 and adds chunk (i-k-2), received from member
// i-1, into its own: chunk c is summed x[c+1] + x[c+2] + ... + x[c], always
// in that order. The chunk sent at step k is not written again in this
// reduce-scatter (it is written at step k-1 and then only at all-gather step
// k), so the sends need not be waited for between steps.
absl::Status Communicator::ring_reduce_scatter(float* data, std::size_t n, std::uint32_t op) {
  const int p = size();
  for (int k = 0; k < p - 1; k++) {
    const int send_c = ((me_ - k - 1) % p + p) % p, recv_c = ((me_ - k - 2) % p + p) % p;
    auto [sb, se] = chunk_range(n, p, send_c);
    auto [rb, re] = chunk_range(n, p, recv_c);
    absl::Status st = exchange((me_ + 1) % p, data + sb, se - sb, (me_ - 1 + p) % p, data + rb,
                               re - rb, Combine::kAdd, op, static_cast<std::uint32_t>(k), -1);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// At step k member i sends chunk (i-k) to i+1 and receives chunk (i-k-1),
// the chunk a reduce-scatter sent at its step k: that send must be done
// first (steps of an all-reduce's all-gather are numbered from p-1).
absl::Status Communicator::ring_all_gather(float* data, std::size_t n, std::uint32_t op,
                                           std::uint32_t step0) {
  const int p = size();
  for (int k = 0; k < p - 1; k++) {
    const int send_c = ((me_ - k) % p + p) % p, recv_c = ((me_ - k - 1) % p + p) % p;
    auto [sb, se] = chunk_range(n, p, send_c);
    auto [rb, re] = chunk_range(n, p, recv_c);
    absl::Status st =
        exchange((me_ + 1) % p, data + sb, se - sb, (me_ - 1 + p) % p, data + rb, re - rb,
                 Combine::kCopy, op, step0 + static_cast<std::uint32_t>(k), step0 > 0 ? k : -1);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// Elements of chunks [a, b).
std::pair<std::size_t, std::size_t> Communicator::chunks(std::size_t n, int a, int b) const {
  return {chunk_range(n, size(), a).first, chunk_range(n, size(), b - 1).second};
}

// Recursive halving, for p a power of two: at step j member i pairs with
// i ^ d (d = p/2, p/4, ..., 1), keeps the half of its current chunks that
// holds chunk i and sends the other half, then adds the partner's partial
// sums of the kept half into its own. After log2(p) steps (the ring takes
// p-1) member i holds the full sum of chunk i, each element summed once, in
// a fixed tree order. A half that is sent is never written again in the
// reduce-scatter.
absl::Status Communicator::halving_reduce_scatter(float* data, std::size_t n, std::uint32_t op) {
  int lo = 0, hi = size();
  std::uint32_t step = 0;
  for (int d = size() / 2; d >= 1; d /= 2, step++) {
    const int mid = lo + (hi - lo) / 2;
    const bool low = (me_ & d) == 0;
    auto [kb, ke] = low ? chunks(n, lo, mid) : chunks(n, mid, hi);
    auto [gb, ge] = low ? chunks(n, mid, hi) : chunks(n, lo, mid);
    absl::Status st = exchange(me_ ^ d, data + gb, ge - gb, me_ ^ d, data + kb, ke - kb,
                               Combine::kAdd, op, step, -1);
    if (!st.ok()) return st;
    (low ? hi : lo) = mid;
  }
  return absl::OkStatus();
}

// Recursive doubling, the halving's mirror: at step j member i pairs with
// i ^ d (d = 1, 2, ..., p/2), sends the chunks it has and receives the
// partner's, which it sent away at the halving's step with the same d:
// those sends are waited for first.
absl::Status Communicator::doubling_all_gather(float* data, std::size_t n, std::uint32_t op,
                                               std::uint32_t step0) {
  int lo = me_, hi = me_ + 1;
  const int levels = std::countr_zero(static_cast<unsigned>(size()));
  std::uint32_t step = step0;
  for (int d = 1, j = 0; d < size(); d *= 2, j++, step++) {
    const bool low = (me_ & d) == 0;
    const int plo = low ? hi : lo - d, phi = low ? hi + d : lo;  // the partner's chunks
    auto [sb, se] = chunks(n, lo, hi);
    auto [rb, re] = chunks(n, plo, phi);
    absl::Status st = exchange(me_ ^ d, data + sb, se - sb, me_ ^ d, data + rb, re - rb,
                               Combine::kCopy, op, step, levels - 1 - j);
    if (!st.ok()) return st;
    lo = std::min(lo, plo);
    hi = std::max(hi, phi);
  }
  return absl::OkStatus();
}

// Every member sends its buffer to every other and sums all p buffers in
// member order.
absl::Status Communicator::direct_all_reduce(float* data, std::size_t n, std::uint32_t op) {
  const int p = size();
  if (scratch_.size() < n * static_cast<std::size_t>(p))
    scratch_.resize(n * static_cast<std::size_t>(p));
  std::copy_n(data, n, scratch_.data() + n * static_cast<std::size_t>(me_));
  Completions done(2 * static_cast<std::size_t>(p - 1), driver_);
  const auto me_global = static_cast<std::uint32_t>(ranks_[static_cast<std::size_t>(me_)]);
  std::size_t k = 0;
  for (int j = 0; j < p; j++) {
    if (j == me_) continue;
    const int g = ranks_[static_cast<std::size_t>(j)];
    transport_.recv(g, collective_tag(static_cast<std::uint32_t>(g), kind_, op, 0, 0),
                    scratch_.data() + n * static_cast<std::size_t>(j), n * sizeof(float),
                    done.callback(k++), token_, route_);
  }
  for (int j = 0; j < p; j++) {
    if (j == me_) continue;
    transport_.send(ranks_[static_cast<std::size_t>(j)], collective_tag(me_global, kind_, op, 0, 0),
                    data, n * sizeof(float), done.callback(k++), token_, route_);
  }
  absl::Status st = wait_all(done, [this](const absl::Status& e) { fail(e); });
  if (!st.ok()) return st;
  for (std::size_t e = 0; e < n; e++) {
    float s = scratch_[e];
    for (int j = 1; j < p; j++) s += scratch_[n * static_cast<std::size_t>(j) + e];
    data[e] = s;
  }
  return absl::OkStatus();
}

// root -> root+1 -> ... -> root+p-1, slice by slice: each member forwards a
// slice as soon as it has it.
absl::Status Communicator::chain_broadcast(float* data, std::size_t n, int root, std::uint32_t op) {
  const int p = size();
  const int pos = (me_ - root + p) % p;  // place in the chain
  const int prev = (me_ - 1 + p) % p, next = (me_ + 1) % p;
  const bool last = pos == p - 1;
  if (pos == 0 || last) {
    absl::Status st = pos == 0
                          ? exchange(next, data, n, me_, nullptr, 0, Combine::kCopy, op, 0, -1)
                          : exchange(me_, nullptr, 0, prev, data, n, Combine::kCopy, op, 0, -1);
    absl::Status sent = wait_sends();
    return st.ok() ? sent : st;
  }
  // Middle of the chain: receive every slice, forward each as it lands.
  const std::size_t slice = slice_for(n, options_.slice_bytes);
  const std::size_t slices = (n + slice - 1) / slice;
  Completions recvs(slices, driver_), sends(slices, driver_);
  const int prev_g = ranks_[static_cast<std::size_t>(prev)],
            next_g = ranks_[static_cast<std::size_t>(next)];
  const auto me_g = static_cast<std::uint32_t>(ranks_[static_cast<std::size_t>(me_)]);
  for (std::size_t s = 0; s < slices; s++) {
    const std::size_t off = s * slice, cnt = std::min(slice, n - off);
    transport_.recv(prev_g,
                    collective_tag(static_cast<std::uint32_t>(prev_g), kind_, op, 0,
                                   static_cast<std::uint32_t>(s)),
                    data + off, cnt * sizeof(float), recvs.callback(s), token_, route_);
  }
  absl::Status first;
  for (std::size_t s = 0; s < slices; s++) {
    const std::size_t off = s * slice, cnt = std::min(slice, n - off);
    absl::Status st = recvs.wait(s);
    if (!st.ok()) {
      if (first.ok()) first = st;
      fail(st);
      st = absl::CancelledError("broadcast aborted");
    }
    if (st.ok()) {
      transport_.send(next_g, collective_tag(me_g, kind_, op, 0, static_cast<std::uint32_t>(s)),
                      data + off, cnt * sizeof(float), sends.callback(s), token_, route_);
    } else {
      sends.callback(s)(st);
    }
  }
  absl::Status st = wait_all(sends);
  return first.ok() ? st : first;
}

}  // namespace troupe::comm
