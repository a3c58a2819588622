// The floor under a hand-off between threads: one thread wakes another
// that sleeps in the kernel, one way, as half a ping-pong. Two kinds:
//
//   eventfd  the waiter blocks in read(2) on an eventfd, the waker write(2)s
//            it (what UCX's progress thread sleeps on: its event fd)
//   futex    the waiter blocks in FUTEX_WAIT on a word, the waker flips the
//            word and FUTEX_WAKEs it (what a mutex and condition variable
//            come down to)
//
// The kernel runs a ping-pong's two threads on one CPU (each wakes the other
// and then sleeps), so those two measure a switch between threads, never a
// CPU that must leave its idle state. Two more kinds measure that:
//
//   eventfd_idle_cpu, futex_idle_cpu
//            the waiter pinned to one CPU, the waker to another; the waker
//            spins a gap between wake-ups (its CPU stays awake, the
//            waiter's goes idle), then stamps CLOCK_MONOTONIC and wakes; the
//            waiter stamps the clock as it returns: one-way, each wake-up
//            timed on its own. A line for each gap of --idle-gaps-us: a
//            CPU just gone idle (10 us) and one idle as between steps (200)
//
// On a virtual machine an idle vCPU halts; its wake-up is an interrupt the
// host must deliver and a vCPU it must run again, unless the guest polls
// before it halts (cpuidle's haltpoll driver with guest_halt_poll_ns > 0).
// Those settings are printed beside the figures.
//
// Prints one JSON object per kind. The ping-pongs: the median and 10th
// percentile of the one-way means of --rounds rounds of --iters round trips.
// The idle-CPU kinds: the median, 10th and 90th percentile of
// --idle-iters single wake-ups (none where fewer than 2 CPUs are allowed).
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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

std::int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (const int e = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); e != 0) {
    errno = e;
    check(false, "pthread_setaffinity_np");
  }
}

// The first two CPUs this process may run on; empty where it has fewer.
std::vector<int> two_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  check(sched_getaffinity(0, sizeof(set), &set) == 0, "sched_getaffinity");
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; c++) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus.size() == 2 ? cpus : std::vector<int>{};
}

// `iters` single wake-ups of a waiter on cpus[1] by a waker on cpus[0],
// `gap_us` apart (the waker spins through the gap); each one-way time in us.
std::vector<double> idle_cpu_one_way(bool use_eventfd, const std::vector<int>& cpus, int iters,
                                     int gap_us) {
  const int fd = use_eventfd ? eventfd(0, 0) : -1;
  check(!use_eventfd || fd >= 0, "eventfd");
  std::atomic<int> word{0};
  std::atomic<std::int64_t> woke{0};
  std::thread waiter([&] {
    pin_to(cpus[1]);
    for (int i = 0; i < iters; i++) {
      if (use_eventfd) {
        std::uint64_t v = 0;
        check(read(fd, &v, sizeof(v)) == sizeof(v), "read");
      } else {
        wait_for(&word);
      }
      woke.store(monotonic_ns(), std::memory_order_release);
    }
  });
  pin_to(cpus[0]);
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; i++) {
    const std::int64_t until = monotonic_ns() + std::int64_t{gap_us} * 1000;
    while (monotonic_ns() < until) {
    }
    woke.store(0, std::memory_order_relaxed);
    const std::int64_t t0 = monotonic_ns();
    if (use_eventfd) {
      const std::uint64_t v = 1;
      check(write(fd, &v, sizeof(v)) == sizeof(v), "write");
    } else {
      wake(&word);
    }
    std::int64_t t1 = 0;
    while ((t1 = woke.load(std::memory_order_acquire)) == 0) {
    }
    us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  waiter.join();
  if (fd >= 0) close(fd);
  return us;
}

// What decides an idle vCPU's wake-up: the cpuidle driver, and the guest's
// halt polling where the haltpoll driver is there ("" where not).
std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"one-way thread wake-up through the kernel (eventfd, futex)"};
  int iters = 20000, rounds = 7, idle_iters = 2000;
  std::vector<int> idle_gaps_us{10, 200};
  app.add_option("--iters", iters, "Round trips per round")->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds (the median and 10th percentile over them)")
      ->capture_default_str();
  app.add_option("--idle-iters", idle_iters, "Single wake-ups of a thread on an idle CPU")
      ->capture_default_str()
      ->check(CLI::Range(10, 1000000));
  app.add_option("--idle-gaps-us", idle_gaps_us,
                 "How long its CPU is idle before each, a line for each (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
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
  const std::vector<int> cpus = two_cpus();
  if (cpus.empty()) {
    std::printf("(no idle-CPU wake-up: this process may run on fewer than 2 CPUs)\n");
    return 0;
  }
  const std::string driver = read_line("/sys/devices/system/cpu/cpuidle/current_driver");
  const std::string poll_ns = read_line("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
  for (const bool use_eventfd : {true, false}) {
    for (const int gap_us : idle_gaps_us) {
      std::vector<double> us = idle_cpu_one_way(use_eventfd, cpus, idle_iters, gap_us);
      std::sort(us.begin(), us.end());
      std::printf(
          "{\"bench\": \"wakeup\", \"kind\": \"%s\", \"one_way_us\": %.3f, \"p10_us\": %.3f, "
          "\"p90_us\": %.3f, \"iters\": %d, \"idle_gap_us\": %d, \"waker_cpu\": %d, "
          "\"waiter_cpu\": %d, \"cpuidle_driver\": \"%s\", \"guest_halt_poll_ns\": %s}\n",
          use_eventfd ? "eventfd_idle_cpu" : "futex_idle_cpu", us[us.size() / 2],
          us[us.size() / 10], us[us.size() * 9 / 10], idle_iters, gap_us, cpus[0], cpus[1],
          driver.c_str(), poll_ns.empty() ? "null" : poll_ns.c_str());
    }
  }
  return 0;
}
