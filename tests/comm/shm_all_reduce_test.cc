// The shared memory all-reduce (comm/shm_all_reduce.h), its members threads
// of this process: the same bits as the Communicator's transport
// algorithms (over the in-process transport, an independent reference) in
// each of their sum orders, and a failure ends every member's wait.
#include "comm/shm_all_reduce.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/inproc_transport.h"

namespace troupe::comm {
namespace {

// Values whose sums depend on their order: magnitudes 2^-10 to 2^10.
std::vector<float> values(int member, std::size_t n) {
  std::mt19937 gen(static_cast<unsigned>(1000 + member));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; i++) x[i] = std::ldexp(u(gen), static_cast<int>(gen() % 21) - 10);
  return x;
}

// Each member's results of the Communicator's all-reduces of `sizes`, one
// after the other, over the in-process transport: by messages, or, where
// the ranks say they share memory, through the segment (direct exchange up
// to `direct_max` bytes, then halving up to `halving_max` where p is a
// power of two, else the ring). `prepare` may set a member's communicator
// up first; `taken` gets each member's count of all-reduces through shared
// memory.
struct Group {
  int p = 3;
  bool shared = false;
  std::size_t direct_max = 4096, halving_max = std::numeric_limits<std::size_t>::max();
  std::function<void(int, Communicator&)> prepare = nullptr;
};

// Runs body(r) for each member on a thread of its own. A member still
// running after 60 s is a hang: `unblock` ends every member's wait, and the
// case fails (rather than waiting for ever).
void run_members(int p, const std::function<void(int)>& body,
                 const std::function<void()>& unblock) {
  std::vector<std::future<void>> members;
  for (int r = 0; r < p; r++) members.push_back(std::async(std::launch::async, body, r));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (auto& m : members) {
    if (m.wait_until(deadline) != std::future_status::ready) {
      ADD_FAILURE() << "a member still waits after 60 s: a hang";
      unblock();
      break;
    }
  }
}

std::vector<std::vector<std::vector<float>>> all_reduces(
    const Group& g, const std::vector<std::size_t>& sizes,
    std::vector<std::uint64_t>* taken = nullptr) {
  auto fabric = std::make_shared<InProcFabric>(g.p);
  if (g.shared) fabric->share_memory_for_test();
  std::vector<int> ranks;
  for (int r = 0; r < g.p; r++) ranks.push_back(r);
  std::vector<std::unique_ptr<Transport>> ts;
  std::vector<std::unique_ptr<Communicator>> cs;
  for (int r = 0; r < g.p; r++) {
    ts.push_back(fabric->endpoint(r));
    cs.push_back(std::make_unique<Communicator>(
        *ts.back(), ranks, GroupKind::kTest,
        CommunicatorOptions{.direct_max_bytes = g.direct_max, .halving_max_bytes = g.halving_max}));
    if (g.prepare) g.prepare(r, *cs.back());
  }
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(g.p));
  run_members(
      g.p,
      [&](int r) {
        for (std::size_t n : sizes) {
          std::vector<float> x = values(r, n);
          const absl::Status st = cs[static_cast<std::size_t>(r)]->all_reduce_sync(x.data(), n);
          EXPECT_TRUE(st.ok()) << st;
          out[static_cast<std::size_t>(r)].push_back(std::move(x));
        }
      },
      [&] {
        for (auto& c : cs) c->fail(absl::DeadlineExceededError("the case's deadline"));
      });
  if (taken != nullptr) {
    for (auto& c : cs) taken->push_back(c->shared_memory_all_reduces());
  }
  return out;
}

std::vector<std::vector<float>> by_transport(int p, std::size_t n, std::size_t halving_max) {
  auto all = all_reduces({.p = p, .halving_max = halving_max}, {n});
  std::vector<std::vector<float>> out;
  for (auto& member : all) out.push_back(std::move(member[0]));
  return out;
}

// Every member's result through one segment, `check` given to each.
// A segment of p members (member 0 made it, the others opened it, its name
// removed); empty where one could not.
std::vector<std::unique_ptr<ShmAllReduce>> segment_of(int p) {
  absl::StatusOr<std::unique_ptr<ShmAllReduce>> first = ShmAllReduce::create(p);
  EXPECT_TRUE(first.ok()) << first.status();
  if (!first.ok()) return {};
  std::vector<std::unique_ptr<ShmAllReduce>> members;
  members.push_back(*std::move(first));
  for (int r = 1; r < p; r++) {
    absl::StatusOr<std::unique_ptr<ShmAllReduce>> m = ShmAllReduce::open(members[0]->name(), p, r);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    members.push_back(*std::move(m));
  }
  members[0]->unlink();
  return members;
}

std::vector<std::vector<float>> by_segment(int p, std::size_t n, SumOrder order) {
  std::vector<std::unique_ptr<ShmAllReduce>> members = segment_of(p);
  if (members.empty()) return {};
  std::vector<std::vector<float>> out(static_cast<std::size_t>(p));
  run_members(
      p,
      [&](int r) {
        std::vector<float> x = values(r, n);
        EXPECT_TRUE(members[static_cast<std::size_t>(r)]
                        ->all_reduce(x.data(), n, order, 0, [] { return absl::OkStatus(); })
                        .ok());
        out[static_cast<std::size_t>(r)] = std::move(x);
      },
      [&] {
        for (auto& m : members) m->fail_all(absl::DeadlineExceededError("the case's deadline"));
      });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Where this host has no usable /dev/shm, the Communicator keeps messages
// (ucx_test); these cases need the segment.
class SharedMemoryAllReduce : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ShmAllReduce>> probe = ShmAllReduce::create(2);
    if (!probe.ok()) GTEST_SKIP() << "no shared memory segment here: " << probe.status();
    (*probe)->unlink();
  }
};

// 600001 floats: ten pieces, none aligned to a member's chunk (of two
// members, more pieces than a slot's places).
TEST_F(SharedMemoryAllReduce, SameBitsAsTheTransportsAlgorithms) {
  constexpr std::size_t kAlways = std::numeric_limits<std::size_t>::max();
  for (int p : {2, 3, 4, 8}) {
    for (std::size_t halving_max : {std::size_t{0}, kAlways}) {
      if (halving_max == 0 && !std::has_single_bit(static_cast<unsigned>(p))) continue;
      for (std::size_t n : {1ul, 7ul, 1000ul, 100003ul, 600001ul}) {
        const SumOrder order = n * sizeof(float) <= 4096 ? SumOrder::kMembers
                               : std::has_single_bit(static_cast<unsigned>(p)) && halving_max > 0
                                   ? SumOrder::kHalving
                                   : SumOrder::kRing;
        const auto want = by_transport(p, n, halving_max);
        const auto got = by_segment(p, n, order);
        ASSERT_EQ(got.size(), static_cast<std::size_t>(p));
        for (int r = 0; r < p; r++) {
          EXPECT_TRUE(same_bits(got[static_cast<std::size_t>(r)], want[0]))
              << "p " << p << ", n " << n << ", halving up to " << halving_max << ": member " << r;
          EXPECT_TRUE(same_bits(want[static_cast<std::size_t>(r)], want[0]));
        }
      }
    }
  }
}

// The case above can fail: another order gives other bits for these values.
TEST_F(SharedMemoryAllReduce, TheOrdersDifferOnTheseValues) {
  const std::size_t n = 100003;
  const auto members = by_segment(4, n, SumOrder::kMembers);
  EXPECT_FALSE(same_bits(by_segment(4, n, SumOrder::kHalving)[0], members[0]));
  EXPECT_FALSE(same_bits(by_segment(4, n, SumOrder::kRing)[0], members[0]));
}

// Each wait ends within 10 s with the failure (Unavailable, `why`). One
// that does not is a hang: `unblock` ends it, and the case fails.
void expect_ended_by(std::vector<std::future<absl::Status>>& waits, const std::string& why,
                     const std::function<void()>& unblock) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto& w : waits) {
    if (w.wait_until(deadline) != std::future_status::ready) {
      ADD_FAILURE() << "a wait did not end: a hang";
      unblock();
    }
    const absl::Status st = w.get();
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_EQ(st.message(), why);
  }
}

// The last member never comes; its abort ends the others' waits with its
// reason, and a member's failing check does the same for all.
TEST_F(SharedMemoryAllReduce, AFailureEndsEveryWait) {
  for (int p : {2, 3})
    for (bool by_check : {false, true}) {
      std::vector<std::unique_ptr<ShmAllReduce>> members = segment_of(p);
      ASSERT_EQ(members.size(), static_cast<std::size_t>(p));
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::future<absl::Status>> waits;
      for (int r = 0; r < p - 1; r++) {
        waits.push_back(std::async(std::launch::async, [&, r] {
          std::vector<float> x(1000, 1.0f);
          return members[static_cast<std::size_t>(r)]->all_reduce(
              x.data(), x.size(), SumOrder::kMembers, 0, [&, r] {
                const bool late =
                    std::chrono::steady_clock::now() - start > std::chrono::milliseconds(20);
                return by_check && r == p - 2 && late
                           ? absl::UnavailableError("the last rank lost: its link closed")
                           : absl::OkStatus();
              });
        }));
      }
      if (!by_check) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        members[static_cast<std::size_t>(p - 1)]->fail_all(
            absl::UnavailableError("the last rank lost: its link closed"));
      }
      expect_ended_by(waits, "the last rank lost: its link closed", [&] {
        for (auto& m : members) {
          m->fail_all(absl::UnavailableError("the last rank lost: its link closed"));
        }
      });
    }
}

bool all_same_bits(const std::vector<std::vector<std::vector<float>>>& got,
                   const std::vector<std::vector<std::vector<float>>>& want) {
  for (std::size_t r = 0; r < got.size(); r++) {
    for (std::size_t k = 0; k < got[r].size(); k++) {
      if (!same_bits(got[r][k], want[0][k])) {
        ADD_FAILURE() << "member " << r << ", all-reduce " << k;
        return false;
      }
    }
  }
  return got.size() == want.size();
}

// The Communicator takes the segment for every all-reduce of a group whose
// ranks share memory, one after the other on the same segment, with the
// sums of its messages: also with no direct exchange, fewer elements than
// members, and chunks some members have none of.
TEST_F(SharedMemoryAllReduce, TheCommunicatorsAllReducesThroughItGiveTheSameBits) {
  const std::vector<std::size_t> sizes = {1, 2, 5, 1000, 100003, 7, 600001, 3};
  for (int p : {2, 3, 4}) {
    for (std::size_t direct_max : {std::size_t{0}, std::size_t{4096}}) {
      for (std::size_t halving_max : {std::size_t{0}, std::numeric_limits<std::size_t>::max()}) {
        const Group by_messages{.p = p, .direct_max = direct_max, .halving_max = halving_max};
        Group shared = by_messages;
        shared.shared = true;
        std::vector<std::uint64_t> taken;
        const auto got = all_reduces(shared, sizes, &taken);
        ASSERT_EQ(taken.size(), static_cast<std::size_t>(p));
        EXPECT_TRUE(all_same_bits(got, all_reduces(by_messages, sizes)))
            << "p " << p << ", direct up to " << direct_max << ", halving up to " << halving_max;
        for (std::uint64_t k : taken) EXPECT_EQ(k, sizes.size());
      }
    }
  }
}

// One member cannot make or open the segment (member 0 makes it): the whole
// group keeps messages, and the sums are right.
TEST_F(SharedMemoryAllReduce, AMemberWithoutTheSegmentKeepsTheGroupOnMessages) {
  const std::vector<std::size_t> sizes = {1000, 100003};
  for (auto [p, without] : {std::pair{4, 0}, std::pair{4, 2}, std::pair{2, 0}, std::pair{2, 1}}) {
    const auto want = all_reduces({.p = p}, sizes);
    std::vector<std::uint64_t> taken;
    const auto got = all_reduces({.p = p,
                                  .shared = true,
                                  .prepare =
                                      [without](int r, Communicator& c) {
                                        if (r == without) c.fail_shared_memory_for_test();
                                      }},
                                 sizes, &taken);
    EXPECT_TRUE(all_same_bits(got, want)) << "p " << p << ", member " << without << " without";
    for (std::uint64_t k : taken) EXPECT_EQ(k, 0u) << "member " << without << " without";
  }
}

// p Communicators of default options over an in-process fabric whose ranks
// say they share memory (so they take the segment).
struct SharedGroupOf {
  std::shared_ptr<InProcFabric> fabric;
  std::vector<std::unique_ptr<Transport>> ts;
  std::vector<std::unique_ptr<Communicator>> cs;
};

SharedGroupOf shared_group_of(int p) {
  SharedGroupOf g{std::make_shared<InProcFabric>(p), {}, {}};
  g.fabric->share_memory_for_test();
  std::vector<int> ranks;
  for (int r = 0; r < p; r++) ranks.push_back(r);
  for (int r = 0; r < p; r++) {
    g.ts.push_back(g.fabric->endpoint(r));
    g.cs.push_back(std::make_unique<Communicator>(*g.ts.back(), ranks, GroupKind::kTest));
  }
  return g;
}

// A member's communicator fails (its liveness check lost a peer) while the
// others wait for it in the segment: their all-reduces end with its cause.
TEST_F(SharedMemoryAllReduce, AFailedMembersCauseEndsTheOthersAllReduces) {
  const int p = 3;
  SharedGroupOf group = shared_group_of(p);
  auto& cs = group.cs;
  std::vector<std::vector<float>> x(p, std::vector<float>(1000, 1.0f));  // (outlives the calls)
  auto unblock = [&] {
    for (auto& c : cs) c->fail(absl::UnavailableError("rank 1 lost: its link closed"));
  };
  run_members(
      p,
      [&](int r) {
        EXPECT_TRUE(cs[static_cast<std::size_t>(r)]
                        ->all_reduce_sync(x[static_cast<std::size_t>(r)].data(), 1000)
                        .ok());
      },
      unblock);
  ASSERT_EQ(cs[0]->shared_memory_all_reduces(), 1u);
  std::vector<std::future<absl::Status>> second;
  for (int r = 0; r < 2; r++) {
    second.push_back(std::async(std::launch::async, [&, r] {
      return cs[static_cast<std::size_t>(r)]->all_reduce_sync(x[static_cast<std::size_t>(r)].data(),
                                                              1000);
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cs[2]->fail(absl::UnavailableError("rank 1 lost: its link closed"));
  expect_ended_by(second, "rank 1 lost: its link closed", unblock);
}

// Through the Communicator, members calling with different sizes, one of
// them small: an error on every member, not a wait for ever (as when two
// members took the segment only from a size up, and one came by messages),
// with the segment still to set up and with it set up.
TEST_F(SharedMemoryAllReduce, TheCommunicatorsMembersCallingWithDifferentSizesAllFail) {
  for (int p : {2, 3}) {
    for (bool set_up_first : {false, true}) {
      SharedGroupOf group = shared_group_of(p);
      auto& cs = group.cs;
      std::vector<absl::Status> got(static_cast<std::size_t>(p));
      run_members(
          p,
          [&](int r) {
            if (set_up_first) {
              std::vector<float> x(100003, 1.0f);
              EXPECT_TRUE(
                  cs[static_cast<std::size_t>(r)]->all_reduce_sync(x.data(), x.size()).ok());
            }
            std::vector<float> x(r == p - 1 ? 1000 : 100003, 1.0f);
            got[static_cast<std::size_t>(r)] =
                cs[static_cast<std::size_t>(r)]->all_reduce_sync(x.data(), x.size());
          },
          [&] {
            for (auto& c : cs) c->fail(absl::DeadlineExceededError("the case's deadline"));
          });
      for (const absl::Status& st : got) {
        EXPECT_TRUE(absl::IsInvalidArgument(st)) << "p " << p << ": " << st;
        EXPECT_NE(st.message().find("shared memory all-reduce"), std::string_view::npos) << st;
      }
      EXPECT_EQ(cs[0]->shared_memory_all_reduces(), set_up_first ? 1u : 0u);
    }
  }
}

// A member whose all-reduce has nothing to sum (0 floats) skips the segment;
// its next all-reduce, of the size the others' current one has, is another
// collective of the group: an error on both, not two calls summed together
// (and the other's next all-reduce waiting for ever).
TEST_F(SharedMemoryAllReduce, AMemberThatSkippedAnAllReduceIsCaught) {
  SharedGroupOf group = shared_group_of(2);
  auto& cs = group.cs;
  std::vector<std::vector<absl::Status>> got(2);
  run_members(
      2,
      [&](int r) {
        // Member 0: 1000, 0, 1000 floats; member 1: 1000, 1000, 1000.
        for (std::size_t n :
             {std::size_t{1000}, r == 0 ? std::size_t{0} : std::size_t{1000}, std::size_t{1000}}) {
          std::vector<float> x(std::max<std::size_t>(n, 1), 1.0f);
          got[static_cast<std::size_t>(r)].push_back(
              cs[static_cast<std::size_t>(r)]->all_reduce_sync(x.data(), n));
        }
      },
      [&] {
        for (auto& c : cs) c->fail(absl::DeadlineExceededError("the case's deadline"));
      });
  ASSERT_EQ(got[0].size(), 3u);
  ASSERT_EQ(got[1].size(), 3u);
  EXPECT_TRUE(got[0][0].ok() && got[0][1].ok() && got[1][0].ok()) << got[0][0] << got[1][0];
  EXPECT_TRUE(absl::IsInvalidArgument(got[0][2])) << got[0][2];  // its 3rd met member 1's 2nd
  EXPECT_TRUE(absl::IsInvalidArgument(got[1][1])) << got[1][1];
  EXPECT_FALSE(got[1][2].ok());  // (the group failed)
}

// Members calling with different sizes: an error on every member, not a
// mix of two all-reduces.
TEST_F(SharedMemoryAllReduce, DifferentSizesAreAnErrorOnEveryMember) {
  for (int p : {2, 3}) {
    std::vector<std::unique_ptr<ShmAllReduce>> members = segment_of(p);
    ASSERT_EQ(members.size(), static_cast<std::size_t>(p));
    std::vector<absl::Status> got(p), again(p);
    run_members(
        p,
        [&](int r) {
          std::vector<float> x(r == 1 ? 999 : 1000, 1.0f);
          got[static_cast<std::size_t>(r)] = members[static_cast<std::size_t>(r)]->all_reduce(
              x.data(), x.size(), SumOrder::kMembers, 0, [] { return absl::OkStatus(); });
          // The segment failed for good: the next call, of one size, fails at once.
          std::vector<float> y(1000, 1.0f);
          again[static_cast<std::size_t>(r)] = members[static_cast<std::size_t>(r)]->all_reduce(
              y.data(), y.size(), SumOrder::kMembers, 1, [] { return absl::OkStatus(); });
        },
        [&] {
          for (auto& m : members) m->fail_all(absl::DeadlineExceededError("the case's deadline"));
        });
    for (const absl::Status& st : got) EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    for (const absl::Status& st : again) EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  }
}

// Two members, all-reduce after all-reduce of new values on one segment:
// 120 pieces, their slots' places taken fifteen times over, each sum the
// float sum of the two members' values (of two, in either order).
TEST_F(SharedMemoryAllReduce, APairsSumsStayRightRoundTheirPlaces) {
  std::vector<std::unique_ptr<ShmAllReduce>> members = segment_of(2);
  ASSERT_EQ(members.size(), 2u);
  const std::size_t n = 3 * ShmAllReduce::kSlotFloats + 12345;  // 4 pieces, the last partly full
  constexpr int kCalls = 30;
  std::vector<std::vector<float>> got(2 * kCalls);
  run_members(
      2,
      [&](int r) {
        for (int k = 0; k < kCalls; k++) {
          std::vector<float> x = values(r + 2 * k, n);
          const absl::Status st = members[static_cast<std::size_t>(r)]->all_reduce(
              x.data(), n, SumOrder::kMembers, static_cast<std::uint32_t>(k),
              [] { return absl::OkStatus(); });
          EXPECT_TRUE(st.ok()) << st;
          got[static_cast<std::size_t>(2 * k + r)] = std::move(x);
        }
      },
      [&] {
        for (auto& m : members) m->fail_all(absl::DeadlineExceededError("the case's deadline"));
      });
  int wrong = 0;
  for (int k = 0; k < kCalls; k++) {
    const std::vector<float> a = values(2 * k, n), b = values(2 * k + 1, n);
    for (int r = 0; r < 2; r++) {
      const std::vector<float>& x = got[static_cast<std::size_t>(2 * k + r)];
      ASSERT_EQ(x.size(), n);
      for (std::size_t i = 0; i < n; i++) {
        if (x[i] != a[i] + b[i] && wrong++ < 5) {
          ADD_FAILURE() << "call " << k << ", member " << r << ", element " << i << ": " << x[i]
                        << ", not " << a[i] + b[i];
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// A segment whose maker died during its setup (its name left behind) is
// removed by the next one made on this host.
TEST_F(SharedMemoryAllReduce, AGoneMakersSegmentIsRemoved) {
  const pid_t child = ::fork();
  if (child == 0) std::_Exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // (its pid names no process now)
  const std::string orphan = "/troupe-" + std::to_string(child) + "-0-test";
  const int fd = ::shm_open(orphan.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  absl::StatusOr<std::unique_ptr<ShmAllReduce>> made = ShmAllReduce::create(3);
  ASSERT_TRUE(made.ok()) << made.status();
  (*made)->unlink();
  const int again = ::shm_open(orphan.c_str(), O_RDONLY, 0);
  EXPECT_LT(again, 0) << orphan << " is still there";
  if (again >= 0) {
    ::close(again);
    ::shm_unlink(orphan.c_str());
  }
}

TEST_F(SharedMemoryAllReduce, OpeningSomethingElseIsAnError) {
  absl::StatusOr<std::unique_ptr<ShmAllReduce>> first = ShmAllReduce::create(3);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<ShmAllReduce>> wrong = ShmAllReduce::open((*first)->name(), 4, 1);
  EXPECT_FALSE(wrong.ok());
  (*first)->unlink();
  EXPECT_FALSE(ShmAllReduce::open((*first)->name(), 3, 1).ok());  // (its name is gone)
}

}  // namespace
}  // namespace troupe::comm
