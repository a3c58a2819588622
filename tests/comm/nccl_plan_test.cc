// The NCCL call plans of comm/nccl_plan.h, run on the CPU through a model of
// NCCL's semantics (as its documentation defines each collective) for p
// members, against reduce-scatter and all-gather computed directly. A GPU
// machine has one device and NCCL refuses two ranks on one, so this is
// where the uneven paths are tested.
#include "comm/nccl_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace troupe::comm {
namespace {

struct Member {
  std::vector<float> in, out;
  std::vector<float>& buf(NcclCall::Buffer b) { return b == NcclCall::Buffer::kIn ? in : out; }
};

// Elements one call reads from its send buffer and writes to its receive
// buffer on `member` (NCCL's definitions; p members).
std::pair<std::size_t, std::size_t> extents(const NcclCall& c, int p, int member) {
  const auto P = static_cast<std::size_t>(p);
  switch (c.op) {
    case NcclCall::Op::kReduceScatter:
      return {c.count * P, c.count};
    case NcclCall::Op::kAllGather:
      return {c.count, c.count * P};
    case NcclCall::Op::kReduce:
      return {c.count, member == c.root ? c.count : 0};
    case NcclCall::Op::kBroadcast:
      return {member == c.root ? c.count : 0, c.count};
    case NcclCall::Op::kAllReduce:
      return {c.count, c.count};
  }
  return {0, 0};
}

// Runs call k of every member's plan (NCCL matches the k-th call of a group
// across members: same op, count and root everywhere).
void run(std::vector<Member>& m, const std::vector<std::vector<NcclCall>>& plans, std::size_t k) {
  const int p = static_cast<int>(m.size());
  const NcclCall& c0 = plans[0][k];
  for (int r = 0; r < p; r++) {
    const NcclCall& c = plans[static_cast<std::size_t>(r)][k];
    ASSERT_EQ(c.op, c0.op);
    ASSERT_EQ(c.count, c0.count);
    ASSERT_EQ(c.root, c0.root);
    auto [reads, writes] = extents(c, p, r);
    ASSERT_LE(c.send.offset + reads, m[static_cast<std::size_t>(r)].buf(c.send.buffer).size())
        << "member " << r << " call " << k << " reads past its buffer";
    ASSERT_LE(c.recv.offset + writes, m[static_cast<std::size_t>(r)].buf(c.recv.buffer).size())
        << "member " << r << " call " << k << " writes past its buffer";
  }
  auto send = [&](int r, std::size_t i) {
    const NcclCall& c = plans[static_cast<std::size_t>(r)][k];
    return m[static_cast<std::size_t>(r)].buf(c.send.buffer)[c.send.offset + i];
  };
  auto recv = [&](int r, std::size_t i) -> float& {
    const NcclCall& c = plans[static_cast<std::size_t>(r)][k];
    return m[static_cast<std::size_t>(r)].buf(c.recv.buffer)[c.recv.offset + i];
  };
  auto sum = [&](std::size_t i) {
    float s = 0;
    for (int r = 0; r < p; r++) s += send(r, i);
    return s;
  };
  const std::size_t n = c0.count;
  // Inputs are read before anything is written (NCCL's out-of-place calls).
  std::vector<std::vector<float>> result(static_cast<std::size_t>(p));
  for (int r = 0; r < p; r++) {
    auto& out = result[static_cast<std::size_t>(r)];
    switch (c0.op) {
      case NcclCall::Op::kAllReduce:
        for (std::size_t i = 0; i < n; i++) out.push_back(sum(i));
        break;
      case NcclCall::Op::kReduceScatter:
        for (std::size_t i = 0; i < n; i++) out.push_back(sum(static_cast<std::size_t>(r) * n + i));
        break;
      case NcclCall::Op::kAllGather:
        for (int j = 0; j < p; j++)
          for (std::size_t i = 0; i < n; i++) out.push_back(send(j, i));
        break;
      case NcclCall::Op::kReduce:
        if (r == c0.root)
          for (std::size_t i = 0; i < n; i++) out.push_back(sum(i));
        break;
      case NcclCall::Op::kBroadcast:
        for (std::size_t i = 0; i < n; i++) out.push_back(send(c0.root, i));
        break;
    }
  }
  for (int r = 0; r < p; r++) {
    const auto& out = result[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < out.size(); i++) recv(r, i) = out[i];
  }
}

float value(int r, std::size_t i) { return static_cast<float>((r * 5 + static_cast<int>(i)) % 17); }

// Member i's part, computed here without chunk_range: the first n % p
// members get one element more.
std::pair<std::size_t, std::size_t> part(std::size_t n, int p, int i) {
  const std::size_t P = static_cast<std::size_t>(p), I = static_cast<std::size_t>(i);
  const std::size_t base = n / P, extra = n % P;
  const std::size_t b = I * base + std::min(I, extra);
  return {b, b + base + (I < extra ? 1 : 0)};
}

class NcclPlan : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(NcclPlan, ReduceScatterEqualsTheDirectSum) {
  auto [p, n] = GetParam();
  std::vector<Member> m(static_cast<std::size_t>(p));
  std::vector<std::vector<NcclCall>> plans;
  for (int r = 0; r < p; r++) {
    auto [b, e] = part(n, p, r);
    auto& x = m[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < n; i++) x.in.push_back(value(r, i));
    x.out.assign(e - b, -1.0f);
    plans.push_back(plan_reduce_scatter(n, p, r));
  }
  for (std::size_t k = 0; k < plans[0].size(); k++) run(m, plans, k);
  for (int r = 0; r < p; r++) {
    auto [b, e] = part(n, p, r);
    for (std::size_t i = b; i < e; i++) {
      float want = 0;
      for (int j = 0; j < p; j++) want += value(j, i);
      ASSERT_EQ(m[static_cast<std::size_t>(r)].out[i - b], want) << "member " << r << " at " << i;
    }
  }
}

TEST_P(NcclPlan, AllGatherPutsEveryPartInPlace) {
  auto [p, n] = GetParam();
  std::vector<Member> m(static_cast<std::size_t>(p));
  std::vector<std::vector<NcclCall>> plans;
  for (int r = 0; r < p; r++) {
    auto [b, e] = part(n, p, r);
    auto& x = m[static_cast<std::size_t>(r)];
    for (std::size_t i = b; i < e; i++) x.in.push_back(value(r, i));
    x.out.assign(n, -1.0f);
    plans.push_back(plan_all_gather(n, p, r));
  }
  for (std::size_t k = 0; k < plans[0].size(); k++) run(m, plans, k);
  for (int r = 0; r < p; r++) {
    for (int j = 0; j < p; j++) {
      auto [b, e] = part(n, p, j);
      for (std::size_t i = b; i < e; i++)
        ASSERT_EQ(m[static_cast<std::size_t>(r)].out[i], value(j, i)) << r << " " << j << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Members, NcclPlan,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(0, 1, 7, 8, 1000, 1001)));

}  // namespace
}  // namespace troupe::comm
