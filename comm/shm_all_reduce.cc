#include "comm/shm_all_reduce.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "comm/add_into.h"
#include "comm/communicator.h"  // chunk_range

namespace troupe::comm {

namespace {

constexpr std::uint64_t kMagic = 0x7472707368617231;   // "trpshar1"
constexpr auto kSpin = std::chrono::microseconds(50);  // yielding, before a futex sleep
constexpr std::size_t kBlock = 2048;                   // floats the halving sums at a time (in L1)

// One atomic a cache line: members' arrivals do not share lines.
struct alignas(64) Line {
  std::atomic<std::uint32_t> v{0};
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen) {
  timespec limit{0, 1000000};  // 1 ms: the wait's check runs at least that often
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &limit, nullptr,
            0);
}

void futex_wake_all(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

absl::Status errno_status(const std::string& what) {
  return absl::InternalError(
      absl::StrCat("shared memory all-reduce: ", what, ": ", std::strerror(errno)));
}

}  // namespace

// The segment: this header, a Member for each, then the members' slots and
// the result, kSlotFloats each; of two members, their slots alone, each
// kPairSlots pieces of kSlotFloats.
struct ShmAllReduce::Header {
  std::uint64_t magic;
  std::uint32_t members;
  std::uint32_t slot_floats;
  Line gen;       // bumped at every arrival and abort: the futex word
  Line sleepers;  // members asleep on gen
  Line aborted;   // 0, or 1 + the member whose reason ends every wait
};

// What only member i writes.
struct alignas(64) ShmAllReduce::Member {
  std::atomic<std::uint32_t> arrivals{0};
  // The running all-reduce's size, order and place among the group's
  // collectives: written before its first arrival, compared by every member
  // past it.
  std::uint64_t n = 0;
  std::uint32_t order = 0;
  std::uint32_t call = 0;
  // Written before this member's abort is published (so read whole).
  int code = 0;
  char reason[500] = {};
};

std::size_t ShmAllReduce::header_bytes(int members) {
  const std::size_t b = sizeof(Header) + sizeof(Member) * static_cast<std::size_t>(members);
  return (b + 4095) / 4096 * 4096;
}

std::size_t ShmAllReduce::slot_floats(int members) {
  return members == 2 ? kPairSlots * kSlotFloats : kSlotFloats;
}

std::size_t ShmAllReduce::segment_bytes(int members) {
  const std::size_t slots = static_cast<std::size_t>(members) + (members == 2 ? 0 : 1);
  return header_bytes(members) + slots * slot_floats(members) * sizeof(float);
}

ShmAllReduce::ShmAllReduce(std::string name, void* base, std::size_t bytes, int members, int me)
    : name_(std::move(name)),
      base_(base),
      bytes_(bytes),
      header_(static_cast<Header*>(base)),
      members_(members),
      me_(me) {}

ShmAllReduce::~ShmAllReduce() { ::munmap(base_, bytes_); }

// Segments of processes that are gone: a member 0 killed during a setup
// leaves its segment's name (/troupe-PID-...), which nothing else removes.
void ShmAllReduce::remove_orphans() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* e = ::readdir(dir)) {
    int pid = 0;
    if (std::sscanf(e->d_name, "troupe-%d-", &pid) != 1 || pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) ::shm_unlink(absl::StrCat("/", e->d_name).c_str());
  }
  ::closedir(dir);
}

absl::StatusOr<std::unique_ptr<ShmAllReduce>> ShmAllReduce::create(int members) {
  remove_orphans();
  static std::atomic<int> made{0};
  std::uint64_t token = 0;
  if (::getrandom(&token, sizeof token, 0) != static_cast<ssize_t>(sizeof token)) {
    return errno_status("getrandom");
  }
  const std::string name = absl::StrCat("/troupe-", ::getpid(), "-", made++, "-", absl::Hex(token));
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno_status(absl::StrCat("shm_open ", name));
  const std::size_t bytes = segment_bytes(members);
  // (posix_fallocate returns the error rather than setting errno.)
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    errno = err;
    return errno_status(absl::StrCat("allocating ", bytes, " bytes of /dev/shm"));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return errno_status("mmap");
  }
  auto* h = new (base) Header{};
  for (int i = 0; i < members; i++) new (&reinterpret_cast<Member*>(h + 1)[i]) Member{};
  h->members = static_cast<std::uint32_t>(members);
  h->slot_floats = static_cast<std::uint32_t>(slot_floats(members));
  h->magic = kMagic;  // (the others open it once told its name, over the transport)
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(name, base, bytes, members, 0));
}

absl::StatusOr<std::unique_ptr<ShmAllReduce>> ShmAllReduce::open(const std::string& name,
                                                                 int members, int me) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return errno_status(absl::StrCat("shm_open ", name));
  const std::size_t bytes = segment_bytes(members);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("shared memory all-reduce: ", name, " is ", st.st_size,
                                            " bytes, not ", bytes));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return errno_status("mmap");
  const auto* h = static_cast<const Header*>(base);
  if (h->magic != kMagic || h->members != static_cast<std::uint32_t>(members) ||
      h->slot_floats != slot_floats(members)) {
    ::munmap(base, bytes);
    return absl::InternalError(
        absl::StrCat("shared memory all-reduce: ", name, " is not a segment for ", members));
  }
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(name, base, bytes, members, me));
}

void ShmAllReduce::unlink() { ::shm_unlink(name_.c_str()); }

ShmAllReduce::Member& ShmAllReduce::member(int i) const {
  return reinterpret_cast<Member*>(static_cast<char*>(base_) + sizeof(Header))[i];
}

float* ShmAllReduce::slot(int member) const {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + header_bytes(members_)) +
         static_cast<std::size_t>(member) * slot_floats(members_);
}

float* ShmAllReduce::result() const { return slot(members_); }

void ShmAllReduce::fail_all(const absl::Status& why) {
  {
    // This member's reason is written only while no abort is published, and
    // published after: a reader of it sees it whole.
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (header_->aborted.v.load() == 0) {
      Member& m = member(me_);
      m.code = static_cast<int>(why.ok() ? absl::StatusCode::kAborted : why.code());
      std::snprintf(m.reason, sizeof m.reason, "%s", std::string(why.message()).c_str());
      std::uint32_t none = 0;
      header_->aborted.v.compare_exchange_strong(none, static_cast<std::uint32_t>(me_) + 1);
    }
  }
  header_->gen.v.fetch_add(1);
  futex_wake_all(&header_->gen.v);
}

absl::Status ShmAllReduce::aborted_status() const {
  const std::uint32_t who = header_->aborted.v.load();
  if (who == 0 || who > static_cast<std::uint32_t>(members_)) {
    return absl::AbortedError("shared memory all-reduce: a member failed");
  }
  const Member& m = member(static_cast<int>(who) - 1);
  return absl::Status(static_cast<absl::StatusCode>(m.code), m.reason);
}

// Arrives (phase_ + 1), then waits for every member's arrival there. A
// member is at most one arrival ahead of the slowest (it waits for all at
// each), so the counters compare by difference, past their wrap.
absl::Status ShmAllReduce::arrive_and_wait(const Check& check) {
  const std::uint32_t target = ++phase_;
  member(me_).arrivals.store(target);
  header_->gen.v.fetch_add(1);
  if (header_->sleepers.v.load() > 0) futex_wake_all(&header_->gen.v);
  auto all_in = [&] {
    for (int j = 0; j < members_; j++) {
      if (static_cast<std::int32_t>(member(j).arrivals.load() - target) < 0) {
        return false;
      }
    }
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (all_in()) return absl::OkStatus();
    if (header_->aborted.v.load() != 0) return aborted_status();
    if (absl::Status st = check(); !st.ok()) {
      fail_all(st);
      return st;
    }
    if (std::chrono::steady_clock::now() - start < kSpin) {
      sched_yield();
      continue;
    }
    // Asleep until the next arrival or abort: counted first, so an arrival
    // after the check below sees a sleeper and wakes it (all sequentially
    // consistent), and one before it changed gen, so the futex returns.
    const std::uint32_t seen = header_->gen.v.load();
    header_->sleepers.v.fetch_add(1);
    if (!all_in() && header_->aborted.v.load() == 0) futex_wait(&header_->gen.v, seen);
    header_->sleepers.v.fetch_sub(1);
  }
}

void ShmAllReduce::sum(std::size_t offset, std::size_t b, std::size_t e, std::size_t n,
                       SumOrder order) {
  const int p = members_;
  float* out = result();
  switch (order) {
    case SumOrder::kMembers:
      std::memcpy(out + b, slot(0) + b, (e - b) * sizeof(float));
      for (int j = 1; j < p; j++) add_into(out + b, slot(j) + b, e - b);
      return;
    case SumOrder::kHalving: {
      // v_j = x_j; for d = p/2, ..., 1: v_j = v_j + v_{j+d} (j < d); the
      // sum is v_0. (Halving's step with distance d adds the partner's
      // partial of the residue class mod d: the same tree.) v_0 is out.
      const int half = p / 2;
      scratch_.resize(static_cast<std::size_t>(half) * kBlock);
      for (std::size_t k = b; k < e; k += kBlock) {
        const std::size_t len = std::min(kBlock, e - k);
        auto v = [&](int j) { return j == 0 ? out + k : scratch_.data() + (j - 1) * kBlock; };
        for (int j = 0; j < half; j++) {
          std::memcpy(v(j), slot(j) + k, len * sizeof(float));
          add_into(v(j), slot(j + half) + k, len);
        }
        for (int d = half / 2; d >= 1; d /= 2) {
          for (int j = 0; j < d; j++) add_into(v(j), v(j + d), len);
        }
      }
      return;
    }
    case SumOrder::kRing: {
      // By the whole buffer's chunks: the fold starts at the member after
      // the element's chunk c (chunk_range: the first `extra` chunks have
      // base + 1 elements, the rest base).
      const auto P = static_cast<std::size_t>(p);
      const std::size_t base = n / P, extra = n % P;
      auto chunk_of = [&](std::size_t g) {
        return g < extra * (base + 1) ? g / (base + 1) : extra + (g - extra * (base + 1)) / base;
      };
      for (std::size_t k = b; k < e;) {
        const std::size_t g = offset + k, c = chunk_of(g);
        const std::size_t len = std::min(e - k, chunk_range(n, p, static_cast<int>(c)).second - g);
        std::memcpy(out + k, slot(static_cast<int>((c + 1) % P)) + k, len * sizeof(float));
        for (std::size_t i = 2; i <= P; i++)
          add_into(out + k, slot(static_cast<int>((c + i) % P)) + k, len);
        k += len;
      }
      return;
    }
  }
}

// Past the first arrival of a call: every member's call is this one (as the
// messages' sizes must match).
absl::Status ShmAllReduce::same_call(std::size_t n) {
  const Member& me = member(me_);
  for (int j = 0; j < members_; j++) {
    const Member& them = member(j);
    if (them.n != n || them.order != me.order || them.call != me.call) {
      absl::Status st = absl::InvalidArgumentError(
          absl::StrCat("shared memory all-reduce: member ", me_, " reduces ", n,
                       " floats as collective ", me.call, ", member ", j, " ", them.n,
                       " as collective ", them.call, " (or in another order)"));
      fail_all(st);
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status ShmAllReduce::all_reduce(float* data, std::size_t n, SumOrder order,
                                      std::uint32_t call, const Check& check) {
  // (A failed segment stays failed: its members' arrivals, and a pair's
  // pieces, may differ by one.)
  if (header_->aborted.v.load() != 0) return aborted_status();
  Member& me = member(me_);
  me.n = n;
  me.order = static_cast<std::uint32_t>(order);
  me.call = call;
  if (members_ == 2) return pair_all_reduce(data, n, check);
  for (std::size_t offset = 0; offset < n; offset += kSlotFloats) {
    const std::size_t len = std::min(kSlotFloats, n - offset);
    std::memcpy(slot(me_), data + offset, len * sizeof(float));  // step 0
    if (absl::Status st = arrive_and_wait(check); !st.ok()) return st;
    if (offset == 0) {
      if (absl::Status st = same_call(n); !st.ok()) return st;
    }
    auto [b, e] = chunk_range(len, members_, me_);  // step 1
    sum(offset, b, e, n, order);
    if (absl::Status st = arrive_and_wait(check); !st.ok()) return st;
    std::memcpy(data + offset, result(), len * sizeof(float));  // step 2
  }
  return absl::OkStatus();
}

// Two members (the header's comment): member m sums chunk_range(len, 2, m)
// of each piece. A member's slot holds the other's half of the piece as it
// gives it (step 0) and its own half's sums (step 1), in the next of its
// kPairSlots places, in turn: a place's lines are written again only
// kPairSlots pieces later, by when the other's core no longer holds them
// (written again at once, every piece ran at a quarter of the speed). Two
// arrivals a piece and none at the end: a place's halves are read by the
// other before its second arrival of that piece (the given half) and before
// its first arrival of the next piece (the sums); this member writes the
// place again at the piece kPairSlots >= 2 later, past both arrivals of the
// piece before that, which wait for the other's.
// Both members go through the places alike (the same pieces: calls of one
// size, checked at each call's first arrival).
absl::Status ShmAllReduce::pair_all_reduce(float* data, std::size_t n, const Check& check) {
  const int other = 1 - me_;
  for (std::size_t offset = 0; offset < n; offset += kSlotFloats) {
    const std::size_t len = std::min(kSlotFloats, n - offset);
    const auto [sum_b, sum_e] = chunk_range(len, 2, me_);      // summed here
    const auto [give_b, give_e] = chunk_range(len, 2, other);  // given to the other
    const std::size_t place = (pieces_++ % kPairSlots) * kSlotFloats;
    float* piece = data + offset;
    float* mine = slot(me_) + place;
    const float* theirs = slot(other) + place;
    std::memcpy(mine + give_b, piece + give_b, (give_e - give_b) * sizeof(float));  // step 0
    if (absl::Status st = arrive_and_wait(check); !st.ok()) return st;
    if (offset == 0) {
      if (absl::Status st = same_call(n); !st.ok()) return st;
    }
    add_into_and_copy(piece + sum_b, mine + sum_b, theirs + sum_b, sum_e - sum_b);  // step 1
    if (absl::Status st = arrive_and_wait(check); !st.ok()) return st;
    std::memcpy(piece + give_b, theirs + give_b, (give_e - give_b) * sizeof(float));  // step 2
  }
  return absl::OkStatus();
}

}  // namespace troupe::comm
