// The anchor: Gloo's ring all-reduces (Debian's libgloo, TCP on loopback: Gloo
// has no shared-memory transport), AllreduceRing and AllreduceRingChunked,
// same sizes, iteration counts and busbw as bench/comm_bench.cc. With
// `chain`, a pipeline's hops instead, as bench/comm_mpi.cc's: BYTES down
// from rank 0 to rank SIZE-1 and back, a step; prints the median step.
//   comm_gloo RANK SIZE STORE_DIR [min_bytes max_bytes]
//   comm_gloo RANK SIZE STORE_DIR chain BYTES STEPS
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "chain_report.h"

template <typename Algo>
void run(const char* name, const std::shared_ptr<gloo::Context>& ctx, std::vector<float>& x,
         std::size_t min_bytes, std::size_t max_bytes) {
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int n = static_cast<int>(bytes / 4);
    const int iters = static_cast<int>(std::clamp<std::size_t>((512u << 20) / bytes, 3, 2000));
    Algo algo(ctx, std::vector<float*>{x.data()}, n);
    algo.run();  // warm-up
    gloo::BarrierAllToOne(ctx).run();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) algo.run();
    const double per =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    if (ctx->rank == 0) {
      const double busbw =
          static_cast<double>(bytes) / per * 2.0 * (ctx->size - 1) / ctx->size / 1e9;
      std::printf(
          "{\"impl\": \"%s\", \"op\": \"allreduce\", \"n\": %d, \"bytes\": %zu, \"time_us\": %.3f, "
          "\"busbw_GBps\": %.4f}\n",
          name, ctx->size, bytes, per * 1e6, busbw);
      std::fflush(stdout);
    }
  }
}

void chain(const std::shared_ptr<gloo::Context>& ctx, std::size_t bytes, int steps) {
  const int rank = ctx->rank, size = ctx->size;
  std::vector<char> a(bytes), g(bytes);
  auto act = ctx->createUnboundBuffer(a.data(), bytes);
  auto grad = ctx->createUnboundBuffer(g.data(), bytes);
  std::vector<double> t(static_cast<std::size_t>(steps));
  gloo::BarrierAllToOne(ctx).run();
  for (int s = 0; s < steps; s++) {
    const auto t0 = std::chrono::steady_clock::now();
    // The receives first, as a pipeline stage posts them; the sends waited
    // for at the step's end, before the buffers are used again.
    if (rank > 0) act->recv(rank - 1, 0);
    if (rank < size - 1) grad->recv(rank + 1, 1);
    if (rank > 0) act->waitRecv();
    if (rank < size - 1) {
      act->send(rank + 1, 0);
      grad->waitRecv();
    }
    if (rank > 0) grad->send(rank - 1, 1);
    if (rank < size - 1) act->waitSend();
    if (rank > 0) grad->waitSend();
    t[static_cast<std::size_t>(s)] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // (rank 0's step spans the others')
  if (rank == 0) print_chain_step("gloo", size, bytes, std::move(t));
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  const bool chained = argc > 6 && std::strcmp(argv[4], "chain") == 0;
  const std::size_t min_bytes = argc > 4 && !chained ? std::strtoull(argv[4], nullptr, 10) : 4096;
  const std::size_t max_bytes =
      argc > 5 && !chained ? std::strtoull(argv[5], nullptr, 10) : (256u << 20);
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->connectFullMesh(store, dev);
  if (chained) {
    chain(ctx, std::strtoull(argv[5], nullptr, 10), std::atoi(argv[6]));
    return 0;
  }
  std::vector<float> x(max_bytes / 4, 1.0f);
  run<gloo::AllreduceRing<float>>("gloo-ring", ctx, x, min_bytes, max_bytes);
  run<gloo::AllreduceRingChunked<float>>("gloo-ring-chunked", ctx, x, min_bytes, max_bytes);
  return 0;
}
