// NCCL collectives on a GPU. Where no GPU is present, each test says so and
// skips; the code is still compiled and linked by every build with CUDA.
#include <gtest/gtest.h>

#ifdef TROUPE_HAVE_NCCL
#include <cuda_runtime.h>

#include <array>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"

namespace troupe::comm {
namespace {

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
bool have_gpu() { return gpus() > 0; }

absl::Status wait(const std::function<void(Callback)>& issue) {
  std::promise<absl::Status> p;
  auto f = p.get_future();
  issue([&](absl::Status st) { p.set_value(st); });
  return f.get();
}

// Runs member(t, its communicator, its stream) for t = 0, 1 on two GPUs at
// once (a thread each); each returns "" when it passed, else why not, and
// so does this, by member.
std::array<std::string, 2> on_two_gpus(
    const std::function<std::string(int, std::unique_ptr<NcclCommunicator>&, cudaStream_t)>&
        member) {
  auto id = nccl_unique_id();
  if (!id.ok()) return {std::string(id.status().message()), std::string(id.status().message())};
  auto run = [&](int t) -> std::string {
    if (cudaSetDevice(t) != cudaSuccess) return "cudaSetDevice";
    auto c = NcclCommunicator::create(*id, t, 2, t);
    if (!c.ok()) return std::string(c.status().message());
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return "stream";
    std::string why = member(t, *c, s);
    cudaStreamDestroy(s);
    return why;
  };
  auto a = std::async(std::launch::async, run, 0);
  auto b = std::async(std::launch::async, run, 1);
  return {a.get(), b.get()};
}

TEST(Nccl, SingleRankCollectivesOnDeviceBuffers) {
  if (!have_gpu())
    GTEST_SKIP() << "no CUDA device on this machine: NCCL tests run on a GPU machine";
  auto id = nccl_unique_id();
  ASSERT_TRUE(id.ok()) << id.status();
  auto c = NcclCommunicator::create(*id, 0, 1, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::size_t n = 1001;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; i++) host[i] = static_cast<float>(i);
  float *d_in = nullptr, *d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_in, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_in, host.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_TRUE(wait([&](Callback cb) { (*c)->all_reduce(d_in, n, cb); }).ok());
  EXPECT_TRUE(wait([&](Callback cb) { (*c)->reduce_scatter(d_in, d_out, n, cb); }).ok());
  EXPECT_TRUE(wait([&](Callback cb) { (*c)->all_gather(d_out, d_in, n, cb); }).ok());
  EXPECT_TRUE(wait([&](Callback cb) { (*c)->broadcast(d_in, n, 0, cb); }).ok());
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), d_in, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(d_in);
  cudaFree(d_out);
}

// The stream-ordered calls (the TP link's on CUDA): each goes into the
// caller's stream behind the work already there. With one member each is a
// copy; a kernel-free check of the order: the input is written on the stream
// just before, the output read just after.
TEST(Nccl, StreamOrderedCallsRunInTheCallersStream) {
  if (!have_gpu())
    GTEST_SKIP() << "no CUDA device on this machine: NCCL tests run on a GPU machine";
  auto id = nccl_unique_id();
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(id->size(), kNcclUniqueIdBytes);
  auto c = NcclCommunicator::create(*id, 0, 1, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  bool failed = false;
  (*c)->on_failure([&failed](absl::Status) { failed = true; });
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const std::size_t n = 1001;
  std::vector<float> host(n), back(n, -1.0f);
  for (std::size_t i = 0; i < n; i++) host[i] = static_cast<float>(i) * 0.5f;
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(b, 0, n * 4, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(a, host.data(), n * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_TRUE((*c)->all_reduce_on(s, a, n).ok());
  EXPECT_TRUE((*c)->reduce_scatter_on(s, a, b, n).ok());
  EXPECT_TRUE((*c)->all_gather_on(s, b, a, n).ok());
  ASSERT_EQ(cudaMemcpyAsync(back.data(), a, n * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(back, host);
  // A failure the owner reports is not echoed back to it; later calls fail.
  (*c)->fail(absl::CancelledError("the run has ended"));
  EXPECT_EQ((*c)->all_reduce_on(s, a, n).message(), "the run has ended");
  c->reset();
  EXPECT_FALSE(failed);
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(s);
}

// Two members, a GPU each, with sizes that do not split evenly (member i's
// part is chunk_range(n, 2, i), as the CPU Communicator's): the TP link's
// stream-ordered calls and the callback ones give the sums and gathers the
// CPU computes. Integers in floats: every sum is exact.
TEST(Nccl, TwoMembersOnTwoGpusAgreeWithTheCpuOnUnevenSplits) {
  if (gpus() < 2) {
    GTEST_SKIP() << "NCCL with two members needs two GPUs; this machine has " << gpus();
  }
  const std::array<std::string, 2> failed =
      on_two_gpus([&](int t, std::unique_ptr<NcclCommunicator>& c, cudaStream_t s) -> std::string {
        std::string why;
        for (std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{4099}}) {
          std::vector<float> x(n), part, whole(n);
          for (std::size_t i = 0; i < n; i++) x[i] = static_cast<float>((t + 1) * (i % 97));
          const auto [begin, end] = chunk_range(n, 2, t);
          part.assign(end - begin, -1.0f);
          float *d = nullptr, *p = nullptr, *g = nullptr;
          cudaMalloc(&d, n * 4);
          cudaMalloc(&p, (end - begin + 1) * 4);
          cudaMalloc(&g, n * 4);
          cudaMemcpyAsync(d, x.data(), n * 4, cudaMemcpyHostToDevice, s);
          absl::Status st = c->reduce_scatter_on(s, d, p, n);  // 3 (i % 97) on my part
          if (st.ok()) st = c->all_gather_on(s, p, g, n);      // 3 (i % 97) everywhere
          if (st.ok()) st = c->all_reduce_on(s, g, n);         // 6 (i % 97)
          cudaMemcpyAsync(whole.data(), g, n * 4, cudaMemcpyDeviceToHost, s);
          cudaMemcpyAsync(part.data(), p, (end - begin) * 4, cudaMemcpyDeviceToHost, s);
          if (cudaStreamSynchronize(s) != cudaSuccess && st.ok()) st = absl::InternalError("sync");
          // And a callback call on the communicator's own stream.
          if (st.ok()) st = wait([&](Callback cb) { c->all_reduce(d, n, cb); });
          std::vector<float> summed(n);
          cudaMemcpy(summed.data(), d, n * 4, cudaMemcpyDeviceToHost);
          cudaFree(d);
          cudaFree(p);
          cudaFree(g);
          if (!st.ok()) return std::string(st.message());
          for (std::size_t i = 0; i < n && why.empty(); i++) {
            const auto v = static_cast<float>(i % 97);
            if (whole[i] != 6 * v) why = "all-reduce of the gather at " + std::to_string(i);
            if (summed[i] != 3 * v) why = "callback all-reduce at " + std::to_string(i);
            if (i >= begin && i < end && part[i - begin] != 3 * v) {
              why = "reduce-scatter at " + std::to_string(i);
            }
          }
          if (!why.empty()) break;
        }
        return why;
      });
  EXPECT_EQ(failed[0], "") << "member 0";
  EXPECT_EQ(failed[1], "") << "member 1";
}

// The rooted stream calls (the ZeRO-1 pieces': a partition's gradient
// reduced to its owner, its new parameters broadcast from it) on two GPUs,
// each member the root in turn, the root's buffer in place on the second
// round. Integers in floats: the sums are exact in any order.
TEST(Nccl, ReduceAndBroadcastOnTwoGpusReachTheRootAndEveryMember) {
  if (gpus() < 2) {
    GTEST_SKIP() << "NCCL with two members needs two GPUs; this machine has " << gpus();
  }
  const std::array<std::string, 2> failed =
      on_two_gpus([&](int t, std::unique_ptr<NcclCommunicator>& c, cudaStream_t s) -> std::string {
        const std::size_t n = 1001;
        std::vector<float> x(n), got(n), sent(n);
        float *d = nullptr, *o = nullptr;
        cudaMalloc(&d, n * 4);
        cudaMalloc(&o, n * 4);
        std::string why;
        for (int root = 0; root < 2 && why.empty(); root++) {
          for (bool in_place : {false, true}) {
            for (std::size_t i = 0; i < n; i++) x[i] = static_cast<float>((t + 1) * (i % 89));
            cudaMemcpyAsync(d, x.data(), n * 4, cudaMemcpyHostToDevice, s);
            float* out = in_place ? d : o;
            absl::Status st = c->reduce_on(s, d, t == root ? out : nullptr, n, root);
            cudaMemcpyAsync(got.data(), out, n * 4, cudaMemcpyDeviceToHost, s);
            // Then the root's d to both (in place: its sum), into `out`.
            if (st.ok()) st = c->broadcast_on(s, d, out, n * 4, root);
            cudaMemcpyAsync(sent.data(), out, n * 4, cudaMemcpyDeviceToHost, s);
            if (cudaStreamSynchronize(s) != cudaSuccess && st.ok())
              st = absl::InternalError("sync");
            if (!st.ok()) {
              why = std::string(st.message());
              break;
            }
            for (std::size_t i = 0; i < n && why.empty(); i++) {
              const auto v = static_cast<float>(i % 89);
              if (t == root && got[i] != 3 * v) why = "reduce at " + std::to_string(i);
              const float want = in_place ? 3 * v : static_cast<float>(root + 1) * v;
              if (sent[i] != want) why = "broadcast at " + std::to_string(i);
            }
          }
        }
        cudaFree(d);
        cudaFree(o);
        return why;
      });
  EXPECT_EQ(failed[0], "") << "member 0";
  EXPECT_EQ(failed[1], "") << "member 1";
}

}  // namespace
}  // namespace troupe::comm
#endif
