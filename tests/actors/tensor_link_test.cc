// The Communicator's collectives as stream calls (actors/rank/tensor_link.h's
// in_stream_collectives, what the CPU and opaque devices run where a GPU
// runs NCCL's): the rooted ones, as the ZeRO-1 pieces will use them.
#include "actors/rank/tensor_link.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/inproc_transport.h"
#include "gpu/precision.h"

namespace troupe::actors {
namespace {

void on_ranks(int p, const std::function<void(int, comm::StreamCollectives&)>& fn) {
  auto fabric = std::make_shared<comm::InProcFabric>(p);
  std::vector<int> ranks;
  for (int r = 0; r < p; r++) ranks.push_back(r);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; r++) {
    threads.emplace_back([&, r] {
      std::unique_ptr<comm::Transport> t = fabric->endpoint(r);
      comm::Communicator c(*t, ranks, comm::GroupKind::kTest);
      std::unique_ptr<comm::StreamCollectives> s = in_stream_collectives(&c);
      fn(r, *s);
    });
  }
  for (auto& t : threads) t.join();
}

// Not exact in any order: a sum in another order gives other bits.
float x(int r, std::size_t i) { return 1.0f / static_cast<float>(3 + 7 * r + static_cast<int>(i)); }

TEST(InStreamCollectives, ReduceOnSumsInMemberOrderIntoTheRootsOut) {
  const std::size_t n = 1000;
  on_ranks(3, [&](int r, comm::StreamCollectives& s) {
    std::vector<float> in(n), out(n, -1.0f);
    for (std::size_t i = 0; i < n; i++) in[i] = x(r, i);
    ASSERT_TRUE(s.reduce_on(nullptr, in.data(), r == 1 ? out.data() : nullptr, n, 1).ok());
    for (std::size_t i = 0; i < n && r == 1; i++) {
      ASSERT_EQ(out[i], ((0.0f + x(0, i)) + x(1, i)) + x(2, i)) << i;
    }
  });
}

TEST(InStreamCollectives, BroadcastOnCopiesTheRootsInToEveryOut) {
  const std::size_t n = 777;
  on_ranks(3, [&](int r, comm::StreamCollectives& s) {
    std::vector<float> in(n, -2.0f), out(n, -1.0f);
    if (r == 2) {
      for (std::size_t i = 0; i < n; i++) in[i] = x(5, i);
    }
    ASSERT_TRUE(s.broadcast_on(nullptr, in.data(), out.data(), n * 4, 2).ok());
    for (std::size_t i = 0; i < n; i++) ASSERT_EQ(out[i], x(5, i)) << "rank " << r << " " << i;
    if (r == 2) {
      EXPECT_EQ(in[0], x(5, 0));  // the root's in is left as it was
    }
  });
}

// Bytes that are not whole floats (a piece of bf16 parameters, at an odd
// element) arrive whole, and nothing past them is written.
TEST(InStreamCollectives, BroadcastOnCopiesBytesThatAreNotWholeFloats) {
  on_ranks(3, [&](int r, comm::StreamCollectives& s) {
    std::vector<std::uint16_t> in(9), out(9, 0xffff);
    for (std::size_t i = 0; i < in.size(); i++) in[i] = static_cast<std::uint16_t>(r == 1 ? i : 0);
    ASSERT_TRUE(s.broadcast_on(nullptr, in.data() + 1, out.data() + 1, 7 * 2, 1).ok());
    EXPECT_EQ(out.front(), 0xffff);
    for (std::size_t i = 1; i < 8; i++) ASSERT_EQ(out[i], i) << "rank " << r;
    EXPECT_EQ(out.back(), 0xffff);
  });
}

// A bf16 tensor's TP all-reduce sums the peers' values in fp32 and rounds
// once: three peers' 1, 2^-8 and 2^-8 make 1 + 2^-7, a bf16 value, where
// rounding after each add would give 1 (1 + 2^-8 is a tie, to even), and
// every peer gets those bits.
TEST(TensorLink, Bf16AllReduceSumsInFp32AndRoundsOnce) {
  auto fabric = std::make_shared<comm::InProcFabric>(3);
  const std::vector<int> ranks = {0, 1, 2};
  std::vector<std::uint16_t> got(3 * 5);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; r++) {
    threads.emplace_back([&, r] {
      std::unique_ptr<comm::Transport> t = fabric->endpoint(r);
      comm::Communicator c(*t, ranks, comm::GroupKind::kTensor);
      model::TensorParallel tp = tensor_link(&c, {.tp = 3, .t = r});
      std::unique_ptr<gpu::Stream> s = gpu::cpu_device().make_stream({.threads = 1});
      gpu::Tensor x = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kBF16, {5});
      for (int i = 0; i < 5; i++)
        x.data<std::uint16_t>()[i] = gpu::f32_to_bf16(r == 0 ? 1.0f : 0x1p-8f);
      tp.all_reduce(*s, x);
      ASSERT_TRUE(s->synchronize().ok());
      for (int i = 0; i < 5; i++)
        got[static_cast<std::size_t>(r * 5 + i)] = x.data<std::uint16_t>()[i];
    });
  }
  for (auto& t : threads) t.join();
  for (std::uint16_t h : got) EXPECT_EQ(gpu::bf16_to_f32(h), 1.0f + 0x1p-7f);
}

TEST(InStreamCollectives, ADeviceStreamOrABadRootIsAnError) {
  on_ranks(2, [&](int, comm::StreamCollectives& s) {
    float v = 1.0f;
    int native = 0;  // any non-null handle: a GPU's stream
    absl::Status st = s.reduce_on(&native, &v, &v, 1, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
    st = s.broadcast_on(&native, &v, &v, 4, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
    st = s.reduce_on(nullptr, &v, &v, 1, 5);
    EXPECT_NE(std::string(st.message()).find("root 5 of 2"), std::string::npos) << st;
  });
}

}  // namespace
}  // namespace troupe::actors
