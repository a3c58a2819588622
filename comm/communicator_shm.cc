// The Communicator's all-reduce through shared memory (comm/shm_all_reduce.h):
// which groups take it, and the setup its first all-reduce runs.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/completions.h"
#include "comm/shm_all_reduce.h"

namespace troupe::comm {

namespace {

// The setup's messages, at algorithm steps no algorithm reaches (an
// all-reduce's messages use steps below 2 log2 p or 2 (p - 1)).
constexpr std::uint32_t kNameStep = 0xFF0, kOpenedStep = 0xFF1, kVerdictStep = 0xFF2;
constexpr std::size_t kNameBytes = 64;  // "/troupe-PID-N", NUL-padded; empty: none

}  // namespace

// Three or more members (two keep Route::kCopies, which measured as fast),
// each a process of this host. Every member decides the same: the members'
// places are all equal exactly when each member's equals all the others'.
bool Communicator::shm_possible() const {
  if (!options_.shared_memory || size() < 3) return false;
  for (int j = 0; j < size(); j++) {
    if (j != me_ && !transport_.shares_memory_with(ranks_[static_cast<std::size_t>(j)])) {
      return false;
    }
  }
  return true;
}

// At the group's first all-reduce (collective `op`):
//   step 0: member 0 makes the segment and sends every other member its name
//           (empty where it could not);
//   step 1: each of them opens it and tells member 0 whether it could;
//   step 2: member 0 removes the name (every member has the segment mapped,
//           or never will) and tells each whether all could.
// All take the segment, or all keep the transport, for good. An error here
// is a transport's (a member lost): the all-reduce fails with it.
absl::StatusOr<bool> Communicator::shm_ready(std::uint32_t op) {
  if (shm_state_ == Shm::kUntried && !shm_possible()) shm_state_ = Shm::kOff;
  if (shm_state_ != Shm::kUntried) return shm_state_ == Shm::kOn;
  const int p = size();
  auto tag = [&](int member, std::uint32_t step) {
    return collective_tag(static_cast<std::uint32_t>(ranks_[static_cast<std::size_t>(member)]),
                          kind_, op, step, 0);
  };
  auto rank_of = [&](int member) { return ranks_[static_cast<std::size_t>(member)]; };
  auto fail_all = [this](const absl::Status& e) { fail(e); };
  std::unique_ptr<ShmAllReduce> segment;
  char all = 0;
  if (me_ == 0) {
    std::array<char, kNameBytes> name{};
    if (absl::StatusOr<std::unique_ptr<ShmAllReduce>> made = ShmAllReduce::create(p); made.ok()) {
      segment = *std::move(made);
      segment->name().copy(name.data(), kNameBytes - 1);
    }
    Completions named(static_cast<std::size_t>(p - 1), driver_),
        heard(static_cast<std::size_t>(p - 1), driver_);
    std::vector<char> opened(static_cast<std::size_t>(p), 0);
    for (int j = 1; j < p; j++) {
      const auto k = static_cast<std::size_t>(j - 1);
      transport_.send(rank_of(j), tag(0, kNameStep), name.data(), kNameBytes, named.callback(k),
                      token_);
      transport_.recv(rank_of(j), tag(j, kOpenedStep), &opened[static_cast<std::size_t>(j)], 1,
                      heard.callback(k), token_);
    }
    absl::Status st = wait_all(named, fail_all);
    if (absl::Status h = wait_all(heard, fail_all); st.ok()) st = h;
    if (segment != nullptr) segment->unlink();
    if (!st.ok()) return st;
    all = segment != nullptr &&
          std::all_of(opened.begin() + 1, opened.end(), [](char c) { return c != 0; });
    Completions told(static_cast<std::size_t>(p - 1), driver_);
    for (int j = 1; j < p; j++) {
      transport_.send(rank_of(j), tag(0, kVerdictStep), &all, 1,
                      told.callback(static_cast<std::size_t>(j - 1)), token_);
    }
    if (absl::Status t = wait_all(told, fail_all); !t.ok()) return t;
  } else {
    std::array<char, kNameBytes> name{};
    Completions named(1, driver_);
    transport_.recv(rank_of(0), tag(0, kNameStep), name.data(), kNameBytes, named.callback(0),
                    token_);
    if (absl::Status st = wait_all(named, fail_all); !st.ok()) return st;
    char opened = 0;
    if (name[0] != 0) {
      absl::StatusOr<std::unique_ptr<ShmAllReduce>> o =
          ShmAllReduce::open(std::string(name.data()), p, me_);
      if (o.ok()) {
        segment = *std::move(o);
        opened = 1;
      }
    }
    Completions said(1, driver_), told(1, driver_);
    transport_.send(rank_of(0), tag(me_, kOpenedStep), &opened, 1, said.callback(0), token_);
    transport_.recv(rank_of(0), tag(0, kVerdictStep), &all, 1, told.callback(0), token_);
    absl::Status st = wait_all(said, fail_all);
    if (absl::Status t = wait_all(told, fail_all); st.ok()) st = t;
    if (!st.ok()) return st;
  }
  if (all == 0) {
    shm_state_ = Shm::kOff;
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  shm_ = std::move(segment);
  shm_state_ = Shm::kOn;
  return true;
}

absl::Status Communicator::shm_all_reduce(float* data, std::size_t n) {
  absl::Status st = shm_->all_reduce(data, n, sum_order(n), [this] {
    if (driver_ != nullptr) driver_->poll();  // (others' messages wait for this thread's polls)
    return failure();
  });
  if (st.ok()) shm_all_reduces_++;
  return st;
}

}  // namespace troupe::comm
