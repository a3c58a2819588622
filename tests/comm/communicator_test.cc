// Collectives over the in-process transport: every collective for 1, 2, 3, 4
// and 8 members, sizes that do not divide (0 and 1 element included), exact
// results, bitwise agreement across members and runs, and a member dying
// mid-operation turning into an error on every other member.
#include "comm/communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "comm/groups.h"
#include "comm/inproc_transport.h"

namespace troupe::comm {
namespace {

// Runs fn(rank, communicator) on p threads over a fresh fabric.
void on_ranks(int p, const std::function<void(int, Communicator&)>& fn,
              CommunicatorOptions options = {}) {
  auto fabric = std::make_shared<InProcFabric>(p);
  std::vector<std::unique_ptr<Transport>> ts;
  for (int r = 0; r < p; r++) ts.push_back(fabric->endpoint(r));
  std::vector<int> ranks(static_cast<std::size_t>(p));
  for (int r = 0; r < p; r++) ranks[static_cast<std::size_t>(r)] = r;
  std::vector<std::thread> threads;
  for (int r = 0; r < p; r++) {
    threads.emplace_back([&, r] {
      Communicator c(*ts[static_cast<std::size_t>(r)], ranks, GroupKind::kTest, options);
      fn(r, c);
    });
  }
  for (auto& t : threads) t.join();
}

// Small integers: every sum is exact in fp32, whatever the order.
float value(int rank, std::size_t i) {
  return static_cast<float>((rank * 7 + static_cast<int>(i % 13)) % 11 - 5);
}

// Small slices so that even a few thousand elements exercise the pipelining.
CommunicatorOptions small_slices() { return {.slice_bytes = 256, .direct_max_bytes = 64}; }

// Each case runs for p members with the all-reduce by ring and, where p is a
// power of two, by recursive halving and doubling.
enum class Algo { kRing, kHalving };
class Collectives : public ::testing::TestWithParam<std::tuple<int, Algo>> {
 protected:
  void SetUp() override { p_ = std::get<0>(GetParam()); }
  CommunicatorOptions with_algo(CommunicatorOptions o) const {
    o.halving_max_bytes = std::get<1>(GetParam()) == Algo::kHalving ? ~std::size_t{0} : 0;
    return o;
  }
  CommunicatorOptions small_slices() const { return with_algo(comm::small_slices()); }
  int p_ = 0;
};

TEST_P(Collectives, AllReduce) {
  const int p = p_;
  for (std::size_t n : {0u, 1u, 7u, 33u, 1000u, 4099u}) {
    on_ranks(
        p,
        [&](int r, Communicator& c) {
          std::vector<float> x(n);
          for (std::size_t i = 0; i < n; i++) x[i] = value(r, i);
          ASSERT_TRUE(c.all_reduce_sync(x.data(), n).ok());
          for (std::size_t i = 0; i < n; i++) {
            float want = 0;
            for (int j = 0; j < p; j++) want += value(j, i);
            ASSERT_EQ(x[i], want) << "n=" << n << " i=" << i << " rank " << r;
          }
        },
        small_slices());
  }
}

TEST_P(Collectives, ReduceScatter) {
  const int p = p_;
  for (std::size_t n : {0u, 1u, 7u, 1000u, 4099u}) {
    on_ranks(
        p,
        [&](int r, Communicator& c) {
          std::vector<float> x(n);
          for (std::size_t i = 0; i < n; i++) x[i] = value(r, i);
          auto [b, e] = chunk_range(n, p, r);
          std::vector<float> out(e - b, -999.0f);
          ASSERT_TRUE(c.reduce_scatter_sync(x.data(), out.data(), n).ok());
          for (std::size_t i = b; i < e; i++) {
            float want = 0;
            for (int j = 0; j < p; j++) want += value(j, i);
            ASSERT_EQ(out[i - b], want) << "n=" << n << " i=" << i;
          }
        },
        small_slices());
  }
}

TEST_P(Collectives, AllGather) {
  const int p = p_;
  for (std::size_t n : {0u, 1u, 7u, 1000u, 4099u}) {
    on_ranks(
        p,
        [&](int r, Communicator& c) {
          auto [b, e] = chunk_range(n, p, r);
          std::vector<float> in(e - b), out(n, -999.0f);
          for (std::size_t i = b; i < e; i++) in[i - b] = static_cast<float>(i) + 0.5f;
          ASSERT_TRUE(c.all_gather_sync(in.data(), out.data(), n).ok());
          for (std::size_t i = 0; i < n; i++) ASSERT_EQ(out[i], static_cast<float>(i) + 0.5f) << i;
        },
        small_slices());
  }
}

TEST_P(Collectives, Broadcast) {
  const int p = p_;
  for (std::size_t n : {0u, 1u, 1000u, 4099u}) {
    for (int root : {0, p - 1}) {
      on_ranks(
          p,
          [&](int r, Communicator& c) {
            std::vector<float> x(n, r == root ? 0.0f : -1.0f);
            if (r == root)
              for (std::size_t i = 0; i < n; i++) x[i] = static_cast<float>(i) * 0.25f;
            ASSERT_TRUE(c.broadcast_sync(x.data(), n, root).ok());
            for (std::size_t i = 0; i < n; i++) ASSERT_EQ(x[i], static_cast<float>(i) * 0.25f);
          },
          small_slices());
    }
  }
}

// The reduce to one member sums in member order from zeros, as a ZeRO-1
// partition's gradient is summed: ((0 + x_0) + x_1) + ..., bit for bit.
// Values with many mantissa bits, so that another order would round
// differently; the root's buffer in place too; other members' `out` null.
TEST_P(Collectives, ReduceSumsInMemberOrderBitForBit) {
  const int p = p_;
  auto x = [](int r, std::size_t i) {  // 24 random bits in [-2^k, 2^k), k = r % 4
    std::uint32_t h =
        static_cast<std::uint32_t>(r) * 0x9E3779B1u ^ static_cast<std::uint32_t>(i) * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    return std::ldexp(static_cast<float>(h >> 8) * 0x1p-23f - 1.0f, r % 4);
  };
  for (std::size_t n : {0u, 1u, 7u, 1000u, 4099u}) {
    for (int root : {0, p - 1}) {
      for (bool in_place : {false, true}) {
        on_ranks(
            p,
            [&](int r, Communicator& c) {
              std::vector<float> in(n), out(n, -999.0f);
              for (std::size_t i = 0; i < n; i++) in[i] = x(r, i);
              float* dst = r != root ? nullptr : in_place ? in.data() : out.data();
              ASSERT_TRUE(c.reduce_sync(in.data(), dst, n, root).ok());
              if (r != root) return;
              for (std::size_t i = 0; i < n; i++) {
                float want = 0.0f;
                for (int j = 0; j < p; j++) want = want + x(j, i);
                ASSERT_EQ(dst[i], want) << "n=" << n << " root " << root << " i=" << i;
              }
            },
            small_slices());
      }
    }
  }
}

TEST(CollectivesReduce, ARootOutsideTheGroupIsAnError) {
  on_ranks(2, [](int, Communicator& c) {
    float x = 1.0f;
    absl::Status st = c.reduce_sync(&x, &x, 1, 2);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ(st.message(), "reduce: root 2 of 2 members");
  });
}

// Bytes that are NaNs and denormals as floats (NCCL's id is any 128
// bytes), and a size that is not a multiple of 4, arrive as they left.
TEST_P(Collectives, BroadcastBytesCarriesEveryByteAsItIs) {
  const int p = p_;
  std::string blob;
  for (int i = 0; i < 131; i++) blob.push_back(static_cast<char>((i * 97 + 255) % 256));
  blob[3] = '\x7f';  // bytes 0-3: a signalling NaN in little-endian f32
  blob[2] = '\x80';
  blob[1] = blob[0] = '\x01';
  on_ranks(
      p,
      [&](int r, Communicator& c) {
        std::string mine = r == p - 1 ? blob : std::string(blob.size(), '\0');
        ASSERT_TRUE(broadcast_bytes(c, &mine, p - 1).ok());
        EXPECT_EQ(mine, blob) << "member " << r;
      },
      small_slices());
}

// Random floats: the sum order matters, and is fixed: every member gets the
// same bits, and so does a second run.
TEST_P(Collectives, AllReduceIsBitwiseIdenticalAcrossMembersAndRuns) {
  const int p = p_;
  const std::size_t n = 5003;
  auto run = [&](CommunicatorOptions o) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(p));
    on_ranks(
        p,
        [&](int r, Communicator& c) {
          std::mt19937 rng(static_cast<unsigned>(r));
          std::normal_distribution<float> d;
          std::vector<float> x(n);
          for (auto& v : x) v = d(rng);
          ASSERT_TRUE(c.all_reduce_sync(x.data(), n).ok());
          out[static_cast<std::size_t>(r)] = x;
        },
        o);
    return out;
  };
  for (CommunicatorOptions o : {small_slices(), with_algo(CommunicatorOptions{})}) {
    auto a = run(o), b = run(o);
    for (int r = 0; r < p; r++) {
      EXPECT_EQ(std::memcmp(a[static_cast<std::size_t>(r)].data(), a[0].data(), n * 4), 0) << r;
      EXPECT_EQ(std::memcmp(a[static_cast<std::size_t>(r)].data(),
                            b[static_cast<std::size_t>(r)].data(), n * 4),
                0);
    }
  }
}

TEST_P(Collectives, ManyInARowKeepTheirOrder) {
  const int p = p_;
  on_ranks(
      p,
      [&](int r, Communicator& c) {
        std::vector<std::vector<float>> bufs(20, std::vector<float>(300));
        std::atomic<int> done{0};
        for (int k = 0; k < 20; k++) {
          for (auto& v : bufs[static_cast<std::size_t>(k)]) v = static_cast<float>(k + r);
          c.all_reduce(bufs[static_cast<std::size_t>(k)].data(), 300, [&](absl::Status st) {
            EXPECT_TRUE(st.ok()) << st;
            done++;
          });
        }
        while (done < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        for (int k = 0; k < 20; k++)
          EXPECT_EQ(bufs[static_cast<std::size_t>(k)][0],
                    static_cast<float>(p * k + p * (p - 1) / 2));
      },
      small_slices());
}

// Synchronous calls run on the caller's thread when nothing is queued, and
// queue behind asynchronous ones otherwise: the order of issue holds (sizes
// differ, so a reordering would be a length mismatch or a wrong sum).
TEST_P(Collectives, SyncCallsKeepTheirPlaceAmongAsyncOnes) {
  const int p = p_;
  on_ranks(
      p,
      [&](int r, Communicator& c) {
        std::vector<std::vector<float>> bufs;
        for (int k = 0; k < 6; k++) bufs.emplace_back(100 + 37 * k, static_cast<float>(k + r));
        std::atomic<int> done{0};
        for (int k = 0; k < 3; k++) {
          auto& b = bufs[static_cast<std::size_t>(k)];
          c.all_reduce(b.data(), b.size(), [&](absl::Status st) {
            EXPECT_TRUE(st.ok()) << st;
            done++;
          });
        }
        for (int k = 3; k < 6; k++) {
          auto& b = bufs[static_cast<std::size_t>(k)];
          ASSERT_TRUE(c.all_reduce_sync(b.data(), b.size()).ok());
        }
        while (done < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        for (int k = 0; k < 6; k++)
          for (float v : bufs[static_cast<std::size_t>(k)])
            ASSERT_EQ(v, static_cast<float>(p * k + p * (p - 1) / 2)) << k;
      },
      small_slices());
}

INSTANTIATE_TEST_SUITE_P(Members, Collectives,
                         ::testing::Values(std::tuple(1, Algo::kRing), std::tuple(2, Algo::kRing),
                                           std::tuple(2, Algo::kHalving),
                                           std::tuple(3, Algo::kRing), std::tuple(4, Algo::kRing),
                                           std::tuple(4, Algo::kHalving),
                                           std::tuple(8, Algo::kRing),
                                           std::tuple(8, Algo::kHalving)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == Algo::kRing ? "_ring" : "_halving");
                         });

// A pulled receive in-process copies nothing: the receiver reads the
// sender's buffer in place, and the send completes only when it lets go.
TEST(InProcPull, ReadsTheSendersBufferInPlaceAndReleasesTheSend) {
  auto fabric = std::make_shared<InProcFabric>(2);
  auto t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
  std::vector<float> src(1000, 2.5f);
  std::promise<absl::Status> sent;
  std::promise<Arrival> arrived;
  t1->recv_pull(0, 7, src.size() * 4, nullptr, [&](Arrival a) { arrived.set_value(std::move(a)); });
  t0->send(1, 7, src.data(), src.size() * 4, [&](absl::Status st) { sent.set_value(st); });
  Arrival a = arrived.get_future().get();
  ASSERT_TRUE(a.status().ok()) << a.status();
  EXPECT_EQ(a.data(), src.data());  // no copy
  auto sent_f = sent.get_future();
  EXPECT_EQ(sent_f.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
      << "the send completed while its bytes were still being read";
  float piece[10];
  ASSERT_TRUE(a.read(40, piece, sizeof piece).ok());
  EXPECT_EQ(piece[0], 2.5f);
  EXPECT_FALSE(a.read(3990, piece, sizeof piece).ok());  // past the end
  a.release();
  EXPECT_TRUE(sent_f.get().ok());
}

// A receiver that gives up tells the sender; a length mismatch fails both.
TEST(InProcPull, ReleaseWithAnErrorFailsTheSendAndLengthsMustMatch) {
  auto fabric = std::make_shared<InProcFabric>(2);
  auto t0 = fabric->endpoint(0), t1 = fabric->endpoint(1);
  std::vector<float> src(16, 1.0f);
  std::promise<absl::Status> sent, sent2;
  std::promise<Arrival> arrived, arrived2;
  t0->send(1, 1, src.data(), 64, [&](absl::Status st) { sent.set_value(st); });
  t1->recv_pull(0, 1, 64, nullptr, [&](Arrival a) { arrived.set_value(std::move(a)); });
  arrived.get_future().get().release(absl::CancelledError("collective aborted"));
  absl::Status st = sent.get_future().get();
  EXPECT_TRUE(absl::IsCancelled(st)) << st;
  t0->send(1, 2, src.data(), 64, [&](absl::Status st) { sent2.set_value(st); });
  t1->recv_pull(0, 2, 32, nullptr, [&](Arrival a) { arrived2.set_value(std::move(a)); });
  EXPECT_TRUE(absl::IsInvalidArgument(arrived2.get_future().get().status()));
  EXPECT_TRUE(absl::IsInvalidArgument(sent2.get_future().get()));
}

// Chunks of 262145 and 262144 floats with 64-float slices need more than the
// tag's 4096 slices, so the slice grows with the message; sender and
// receiver must grow it alike (a regression: they once disagreed).
TEST(CollectivesSlicing, UnevenChunksPastTheSliceLimitAgree) {
  const std::size_t n = 786433;
  on_ranks(3,
           [&](int r, Communicator& c) {
             std::vector<float> x(n);
             for (std::size_t i = 0; i < n; i++) x[i] = value(r, i);
             absl::Status st = c.all_reduce_sync(x.data(), n);
             ASSERT_TRUE(st.ok()) << st;
             for (std::size_t i = 0; i < n; i += 997)
               ASSERT_EQ(x[i], value(0, i) + value(1, i) + value(2, i));
           },
           {.slice_bytes = 256, .direct_max_bytes = 64});
}

// Rank 2 of a 4-member ring dies mid all-reduce. The liveness check tells
// every survivor, which fails the transport's operations with rank 2 and
// aborts every communicator containing it: all three survivors' collectives
// complete with the error, including those of ranks 0 and 1, which wait on
// live neighbours only.
TEST(CollectivesFailure, DeadMemberIsAnErrorOnEveryOtherMember) {
  const int p = 4, dead = 2;
  auto fabric = std::make_shared<InProcFabric>(p);
  std::vector<std::unique_ptr<Transport>> ts;
  for (int r = 0; r < p; r++) ts.push_back(fabric->endpoint(r));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < p; r++) {
    comms.push_back(std::make_unique<Communicator>(*ts[static_cast<std::size_t>(r)],
                                                   std::vector<int>{0, 1, 2, 3}, GroupKind::kTest,
                                                   small_slices()));
  }
  const std::size_t n = 1 << 16;
  std::vector<std::vector<float>> bufs(p, std::vector<float>(n, 1.0f));
  std::vector<std::promise<absl::Status>> results(p);
  for (int r = 0; r < p; r++) {
    if (r == dead) continue;  // never takes part: as if killed before its first send
    comms[static_cast<std::size_t>(r)]->all_reduce(
        bufs[static_cast<std::size_t>(r)].data(), n,
        [&, r](absl::Status st) { results[static_cast<std::size_t>(r)].set_value(st); });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status why = absl::UnavailableError("rank 2 on host test died");
  for (int r = 0; r < p; r++) {  // the liveness check's message, on each survivor
    if (r == dead) continue;
    ts[static_cast<std::size_t>(r)]->fail_peer(dead, why);
    if (comms[static_cast<std::size_t>(r)]->contains(dead))
      comms[static_cast<std::size_t>(r)]->fail(why);
  }
  for (int r = 0; r < p; r++) {
    if (r == dead) continue;
    auto f = results[static_cast<std::size_t>(r)].get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "rank " << r << " hangs";
    absl::Status st = f.get();
    EXPECT_TRUE(absl::IsUnavailable(st)) << r << ": " << st;
    EXPECT_EQ(st.message(), "rank 2 on host test died");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 5.0);
  // Later collectives fail at once with the same error.
  EXPECT_TRUE(absl::IsUnavailable(comms[0]->all_reduce_sync(bufs[0].data(), 4)));
}

TEST(Groups, MegatronRankOrder) {
  Layout l{.tp = 2, .pp = 2, .dp = 2};
  ASSERT_TRUE(l.validate().ok());
  EXPECT_EQ(l.world(), 8);
  EXPECT_EQ(l.coord(5), (Coord{.d = 0, .s = 1, .t = 1}));
  for (int r = 0; r < 8; r++) EXPECT_EQ(l.rank(l.coord(r)), r);
  EXPECT_EQ(l.tensor_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.data_group(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.pipeline_group(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.embedding_group(3), (std::vector<int>{3, 7}));
  Layout one{.tp = 4};
  EXPECT_EQ(one.embedding_group(2), (std::vector<int>{2}));
  EXPECT_FALSE((Layout{.tp = 0}).validate().ok());
}

TEST(Tag, FieldsRoundTrip) {
  TagFields f{.source = 4479,
              .group = GroupKind::kData,
              .kind = MessageKind::kGradSlice,
              .step = 65535,
              .micro = 200,
              .chunk = 3,
              .layer = 104};
  TagFields g = parse_tag(make_tag(f));
  EXPECT_EQ(g.source, 4479u);
  EXPECT_EQ(g.group, GroupKind::kData);
  EXPECT_EQ(g.kind, MessageKind::kGradSlice);
  EXPECT_EQ(g.step, 65535u);
  EXPECT_EQ(g.micro, 200u);
  EXPECT_EQ(g.chunk, 3u);
  EXPECT_EQ(g.layer, 104u);
  // Pipeline messages name up to 2^20 micro-batches (no layer): every one
  // of them round-trips, and two micro-batches never share a tag.
  for (const MessageKind k : {MessageKind::kActivation, MessageKind::kGradient}) {
    for (const std::uint32_t micro : {0u, 255u, 256u, 300u, 65535u, 65536u, kMaxMicroBatches - 1}) {
      const TagFields p{.source = 7,
                        .group = GroupKind::kPipeline,
                        .kind = k,
                        .step = 3,
                        .micro = micro,
                        .chunk = 15,
                        .layer = 0};
      const TagFields q = parse_tag(make_tag(p));
      EXPECT_EQ(q.micro, micro);
      EXPECT_EQ(q.chunk, 15u);
      EXPECT_EQ(q.step, 3u);
      EXPECT_EQ(q.kind, k);
    }
    std::set<Tag> tags;
    for (std::uint32_t micro = 0; micro < 70000; micro++) {
      tags.insert(
          make_tag({.source = 1, .group = GroupKind::kPipeline, .kind = k, .micro = micro}));
    }
    EXPECT_EQ(tags.size(), 70000u);
  }
  EXPECT_NE(collective_tag(1, GroupKind::kData, 7, 0, 0),
            collective_tag(1, GroupKind::kData, 8, 0, 0));
}

}  // namespace
}  // namespace troupe::comm
