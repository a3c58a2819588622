// The floor under a hand-off between threads: one thread wakes another
// that sleeps in the kernel, one way, as half a ping-pong. Two kinds:
//
//   eventfd  the waiter blocks in read(2) on an eventfd, the waker write(2)s
//            it (what UCX's progress thread sleeps on: its event fd)
//   futex    the waiter blocks in FUTEX_WAIT on a word, the waker flips the
//            word and FUTEX_WAKEs it (what a mutex and condition variable
//            come down to)
//
// Prints one JSON object per kind: the median and 10th percentile of the
// one-way times over --rounds rounds of --iters round trips each.
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

// An eventfd each way; `iters` round trips, the one-way mean in us.
double eventfd_one_way(int iters) {
  const int ping = eventfd(0, 0), pong = eventfd(0, 0);
  check(ping >= 0 && pong >= 0, "eventfd");
  std::thread echo([&] {
    std::uint64_t v = 0;
    for (int i = 0; i < iters; i++) {
      check(read(ping, &v, sizeof(v)) == sizeof(v), "read");
      v = 1;
      check(write(pong, &v, sizeof(v)) == sizeof(v), "write");
    }
  });
  const auto t0 = Clock::now();
  std::uint64_t v = 1;
  for (int i = 0; i < iters; i++) {
    v = 1;
    check(write(ping, &v, sizeof(v)) == sizeof(v), "write");
    check(read(pong, &v, sizeof(v)) == sizeof(v), "read");
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  echo.join();
  close(ping);
  close(pong);
  return us / iters / 2;
}

long futex(std::atomic<int>* word, int op, int value) {
  return syscall(SYS_futex, reinterpret_cast<int*>(word), op, value, nullptr, nullptr, 0);
}

// A word each way: the waiter sleeps in FUTEX_WAIT until the word is 1.
void wait_for(std::atomic<int>* word) {
  while (word->load(std::memory_order_acquire) == 0) futex(word, FUTEX_WAIT_PRIVATE, 0);
  word->store(0, std::memory_order_relaxed);
}

void wake(std::atomic<int>* word) {
  word->store(1, std::memory_order_release);
  futex(word, FUTEX_WAKE_PRIVATE, 1);
}

double futex_one_way(int iters) {
  std::atomic<int> ping{0}, pong{0};
  std::thread echo([&] {
    for (int i = 0; i < iters; i++) {
      wait_for(&ping);
      wake(&pong);
    }
  });
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; i++) {
    wake(&ping);
    wait_for(&pong);
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  echo.join();
  return us / iters / 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"one-way thread wake-up through the kernel (eventfd, futex)"};
  int iters = 20000, rounds = 7;
  app.add_option("--iters", iters, "Round trips per round")->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds (the median and 10th percentile over them)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  for (const std::string kind : {"eventfd", "futex"}) {
    std::vector<double> us;
    for (int r = 0; r < rounds; r++) {
      us.push_back(kind == "eventfd" ? eventfd_one_way(iters) : futex_one_way(iters));
    }
    std::sort(us.begin(), us.end());
    std::printf(
        "{\"bench\": \"wakeup\", \"kind\": \"%s\", \"one_way_us\": %.3f, \"p10_us\": %.3f, "
        "\"iters\": %d, \"rounds\": %d}\n",
        kind.c_str(), us[us.size() / 2], us[us.size() / 10], iters, rounds);
  }
  return 0;
}
