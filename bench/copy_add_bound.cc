// What one thread can do for a 2-rank all-reduce of 4 MiB on this machine:
// read the peer's half with process_vm_readv (as comm/'s single-copy
// protocol does), add it into ours, read the other half. Read in pieces of
// --piece-kib, each added right away while it is in cache; one piece of the
// whole half is what comm/ does today (read into a scratch buffer, add later).
// Prints the time and the busbw it would give (nccl-tests definition).
//
//   build/bench/copy_add_bound --piece-kib 128
#include <sys/uio.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"single-thread bound of a 2-rank all-reduce (CMA read + add)"};
  std::size_t mib = 4, piece_kib = 0;
  app.add_option("--mib", mib, "All-reduce size")->capture_default_str();
  app.add_option("--piece-kib", piece_kib, "Read-and-add piece (0: the whole half at once)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::size_t n = mib << 18, half = n / 2;  // floats
  const std::size_t piece = piece_kib == 0 ? half : std::min(half, piece_kib << 8);
  std::vector<float> mine(n, 1.0f), peer(n, 2.0f), scratch(piece);
  const pid_t self = getpid();  // the "peer" is this process: same syscall, same copy
  auto read = [&](float* to, const float* from, std::size_t count) {
    iovec local{to, count * sizeof(float)}, remote{const_cast<float*>(from), count * sizeof(float)};
    return process_vm_readv(self, &local, 1, &remote, 1, 0) ==
           static_cast<ssize_t>(count * sizeof(float));
  };
  for (int round = 0; round < 3; round++) {
    const int iters = 50;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) {
      for (std::size_t off = 0; off < half; off += piece) {  // reduce-scatter step
        const std::size_t count = std::min(piece, half - off);
        if (!read(scratch.data(), peer.data() + off, count)) return 1;
        float* acc = mine.data() + off;
        for (std::size_t e = 0; e < count; e++) acc[e] = scratch[e] + acc[e];
      }
      if (!read(mine.data() + half, peer.data() + half, half)) return 1;  // all-gather step
    }
    const double per =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::printf(
        "{\"bench\": \"copy_add_bound\", \"bytes\": %zu, \"piece_bytes\": %zu, "
        "\"time_us\": %.1f, \"busbw_GBps\": %.3f}\n",
        n * sizeof(float), piece * sizeof(float), per * 1e6,
        static_cast<double>(n * sizeof(float)) / per / 1e9);
  }
  return 0;
}
