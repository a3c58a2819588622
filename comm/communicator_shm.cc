// The Communicator's all-reduce through shared memory (comm/shm_all_reduce.h):
// which groups take it, and the setup its first all-reduce runs.
#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/completions.h"
#include "comm/shm_all_reduce.h"

namespace troupe::comm {

namespace {

// The setup's messages, at algorithm steps no algorithm reaches (an
// all-reduce's messages use steps below 2 log2 p or 2 (p - 1)).
constexpr std::uint32_t kHereStep = 0xFF0, kNameStep = 0xFF1, kOpenedStep = 0xFF2,
                        kVerdictStep = 0xFF3;
constexpr std::size_t kNameBytes = 80;  // the segment's name, NUL-padded; empty: none

}  // namespace

// Two or more members, each a process of this host. Every member decides the
// same: the members' places are all equal exactly when each member's equals
// all the others'.
bool Communicator::shm_possible() const {
  if (!options_.shared_memory || size() < 2) return false;
  for (int j = 0; j < size(); j++) {
    if (j != me_ && !transport_.shares_memory_with(ranks_[static_cast<std::size_t>(j)])) {
      return false;
    }
  }
  return true;
}

// At the group's first all-reduce (collective `op`):
//   step 0: every other member tells member 0 it is here (so the segment's
//           name exists only from there to the replies of step 2: a member
//           0 killed meanwhile leaves it, which the next segment made on
//           this host removes, ShmAllReduce::create);
//   step 1: member 0 makes the segment and sends the others its name (empty
//           where it could not);
//   step 2: each of them opens it and tells member 0 whether it could;
//   step 3: member 0 removes the name (every member has the segment mapped,
//           or never will) and tells each whether all could.
// All take the segment, or all keep the transport, for good. An error here
// is a transport's (a member lost): the all-reduce fails with it, and a
// segment in hand is failed with it (a member told to take it may wait
// there already).
absl::StatusOr<bool> Communicator::shm_ready(std::uint32_t op) {
  if (shm_state_ == Shm::kUntried && !shm_possible()) shm_state_ = Shm::kOff;
  if (shm_state_ != Shm::kUntried) return shm_state_ == Shm::kOn;
  const int p = size();
  auto tag = [&](int member, std::uint32_t step) {
    return collective_tag(static_cast<std::uint32_t>(ranks_[static_cast<std::size_t>(member)]),
                          kind_, op, step, 0);
  };
  auto rank_of = [&](int member) { return ranks_[static_cast<std::size_t>(member)]; };
  auto fail_group = [this](const absl::Status& e) { fail(e); };
  std::unique_ptr<ShmAllReduce> segment;
  auto fails = [&](const absl::Status& st) {
    if (segment != nullptr) segment->fail_all(st);
    return st;
  };
  char all = 0;
  if (me_ == 0) {
    std::vector<char> here(static_cast<std::size_t>(p), 0), opened(here);
    Completions arrived(static_cast<std::size_t>(p - 1), driver_);
    for (int j = 1; j < p; j++) {
      transport_.recv(rank_of(j), tag(j, kHereStep), &here[static_cast<std::size_t>(j)], 1,
                      arrived.callback(static_cast<std::size_t>(j - 1)), token_);
    }
    if (absl::Status st = wait_all(arrived, fail_group); !st.ok()) return st;
    std::array<char, kNameBytes> name{};
    absl::StatusOr<std::unique_ptr<ShmAllReduce>> made =
        shm_fault_ ? absl::UnavailableError("a fault for a test") : ShmAllReduce::create(p);
    if (made.ok()) {
      segment = *std::move(made);
      segment->name().copy(name.data(), kNameBytes - 1);
    }
    Completions named(static_cast<std::size_t>(p - 1), driver_),
        heard(static_cast<std::size_t>(p - 1), driver_);
    for (int j = 1; j < p; j++) {
      const auto k = static_cast<std::size_t>(j - 1);
      transport_.send(rank_of(j), tag(0, kNameStep), name.data(), kNameBytes, named.callback(k),
                      token_);
      transport_.recv(rank_of(j), tag(j, kOpenedStep), &opened[static_cast<std::size_t>(j)], 1,
                      heard.callback(k), token_);
    }
    absl::Status st = wait_all(named, fail_group);
    if (absl::Status h = wait_all(heard, fail_group); st.ok()) st = h;
    if (segment != nullptr) segment->unlink();
    if (!st.ok()) return fails(st);
    all = segment != nullptr &&
          std::all_of(opened.begin() + 1, opened.end(), [](char c) { return c != 0; });
    Completions told(static_cast<std::size_t>(p - 1), driver_);
    for (int j = 1; j < p; j++) {
      transport_.send(rank_of(j), tag(0, kVerdictStep), &all, 1,
                      told.callback(static_cast<std::size_t>(j - 1)), token_);
    }
    if (absl::Status t = wait_all(told, fail_group); !t.ok()) return fails(t);
  } else {
    const char here = 1;
    std::array<char, kNameBytes> name{};
    Completions said_here(1, driver_), named(1, driver_);
    transport_.send(rank_of(0), tag(me_, kHereStep), &here, 1, said_here.callback(0), token_);
    transport_.recv(rank_of(0), tag(0, kNameStep), name.data(), kNameBytes, named.callback(0),
                    token_);
    absl::Status st = wait_all(said_here, fail_group);
    if (absl::Status n = wait_all(named, fail_group); st.ok()) st = n;
    if (!st.ok()) return st;
    char opened = 0;
    if (name[0] != 0 && !shm_fault_) {
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
    st = wait_all(said, fail_group);
    if (absl::Status t = wait_all(told, fail_group); st.ok()) st = t;
    if (!st.ok()) return fails(st);
  }
  if (all == 0) {
    shm_state_ = Shm::kOff;
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.ok()) segment->fail_all(aborted_);  // (failed meanwhile: fail() found no segment)
  shm_ = std::move(segment);
  shm_state_ = Shm::kOn;
  return true;
}

// This thread stops driving the transport meanwhile: the transport's own
// thread serves the other threads' messages (a pipeline's, a single copy's
// acknowledgements) while the members wait on one another here. (The
// collective's scope is the only one driving on this thread: execute().)
absl::Status Communicator::shm_all_reduce(float* data, std::size_t n, std::uint32_t op) {
  struct Undrive {
    explicit Undrive(Transport*& d) : slot(d), driver(std::exchange(d, nullptr)) {
      if (driver != nullptr) driver->drive_end();
    }
    ~Undrive() {  // (also by an exception: the scope's own drive_end comes after)
      if (driver != nullptr) driver->drive_begin();
      slot = driver;
    }
    Transport*& slot;
    Transport* driver;
  } undrive(driver_);
  absl::Status st = shm_->all_reduce(data, n, sum_order(n), op, [this] { return failure(); });
  if (st.ok()) shm_all_reduces_++;
  return st;
}

}  // namespace troupe::comm
