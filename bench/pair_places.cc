// Why the shared memory all-reduce of two members takes its slot's places in
// turn (comm/shm_all_reduce.h): a 2-rank all-reduce of --mib MiB of floats,
// two processes bound to a core each, by one of
//   segment  comm/'s way for two: per 256 KiB piece, each copies the half the
//            other sums into its slot, sums its own half from the other's
//            slot into its buffer and its slot in one pass, copies the
//            other half's sums out of the other's slot; a slot of --places
//            pieces, taken in turn (comm/ has 8; 1 is what three or more
//            members do, rewriting one slot at every piece)
//   cma      Rabenseifner's halves by process_vm_readv, as comm/'s messages'
//            single copy and OpenMPI's vader: read the peer's half in 512
//            KiB slices, add each; then read the peer's other half of sums
// Barriers spin on a counter each (no sleeps, no transport). Prints one JSON
// line: the time of one all-reduce and its busbw (nccl-tests' definition).
//
//   build/bench/pair_places --way segment --places 1 --mib 1
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kPiece = 64 << 10;   // floats: comm/'s kSlotFloats
constexpr std::size_t kSlice = 128 << 10;  // floats: 512 KiB reads

struct alignas(64) Counter {
  std::atomic<long> v{0};
};

struct Shared {
  Counter arrived[2];
  pid_t pid[2];
  float* buffer[2];
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a 2-rank all-reduce through a shared slot of N places, or by process_vm_readv"};
  std::string way = "segment";
  std::size_t mib = 1, places = 8;
  int iters = 300;
  app.add_option("--way", way)->check(CLI::IsMember({"segment", "cma"}));
  app.add_option("--places", places, "segment: a slot's pieces")->check(CLI::Range(1, 64));
  app.add_option("--mib", mib, "All-reduce size")->check(CLI::Range(1, 256));
  app.add_option("--iters", iters)->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  const std::size_t n = mib << 18;
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const std::size_t slot_floats = places * kPiece;
  auto* slots =
      static_cast<float*>(mmap(nullptr, 2 * slot_floats * sizeof(float), PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED || slots == MAP_FAILED) {
    std::perror("pair_places: mmap");
    return 1;
  }
  new (shared) Shared{};
  const pid_t child = fork();
  const int me = child == 0 ? 1 : 0, other = 1 - me;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(me % std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))), &set);
  sched_setaffinity(0, sizeof set, &set);
  std::vector<float> buffer(n, 1.0f), scratch(kSlice);
  long phase = 0;
  auto barrier = [&] {
    shared->arrived[me].v.store(++phase);
    while (shared->arrived[other].v.load() < phase) {
    }
  };
  shared->pid[me] = getpid();
  shared->buffer[me] = buffer.data();
  barrier();
  auto read = [&](float* to, const float* from, std::size_t floats) {
    iovec local{to, floats * sizeof(float)},
        remote{const_cast<float*>(from), floats * sizeof(float)};
    if (process_vm_readv(shared->pid[other], &local, 1, &remote, 1, 0) !=
        static_cast<ssize_t>(floats * sizeof(float))) {
      std::perror("pair_places: process_vm_readv");
      std::_Exit(1);
    }
  };
  std::size_t pieces = 0;
  auto all_reduce = [&] {
    float* data = buffer.data();
    if (way == "cma") {
      const std::size_t half = n / 2, mine = me * half, theirs = other * half;
      for (std::size_t k = 0; k < half; k += kSlice) {
        const std::size_t len = std::min(kSlice, half - k);
        read(scratch.data(), shared->buffer[other] + mine + k, len);
        for (std::size_t i = 0; i < len; i++) data[mine + k + i] += scratch[i];
      }
      barrier();
      read(data + theirs, shared->buffer[other] + theirs, half);
      barrier();
      return;
    }
    for (std::size_t offset = 0; offset < n; offset += kPiece) {
      const std::size_t len = std::min(kPiece, n - offset), half = len / 2;
      const std::size_t sum_b = me * half, sum_e = me ? len : half;
      const std::size_t give_b = other * half, give_e = other ? len : half;
      const std::size_t place = (pieces++ % places) * kPiece;
      float* piece = data + offset;
      float* mine = slots + me * slot_floats + place;
      const float* theirs = slots + other * slot_floats + place;
      std::memcpy(mine + give_b, piece + give_b, (give_e - give_b) * sizeof(float));
      barrier();
      for (std::size_t i = sum_b; i < sum_e; i++) {
        const float sum = theirs[i] + piece[i];
        piece[i] = sum;
        mine[i] = sum;
      }
      barrier();
      std::memcpy(piece + give_b, theirs + give_b, (give_e - give_b) * sizeof(float));
    }
  };
  for (int i = 0; i < 20; i++) all_reduce();
  barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++) all_reduce();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
      iters;
  if (me == 0) {
    std::printf(
        "{\"bench\": \"pair_places\", \"way\": \"%s\", \"places\": %zu, \"bytes\": %zu, "
        "\"time_us\": %.1f, \"busbw_GBps\": %.2f}\n",
        way.c_str(), way == "segment" ? places : 0, n * sizeof(float), us,
        static_cast<double>(n * sizeof(float)) / us / 1e3);
    waitpid(child, nullptr, 0);
  }
  return 0;
}
