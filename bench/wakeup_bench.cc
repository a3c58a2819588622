// The floor under a hand-off between threads: one thread wakes another
// that sleeps in the kernel, one way. Two ways to sleep:
//
//   eventfd  the waiter blocks in read(2) on an eventfd, the waker write(2)s
//            it (what UCX's progress thread sleeps on: its event fd)
//   futex    the waiter blocks in FUTEX_WAIT on a word, the waker flips the
//            word and FUTEX_WAKEs it (what a mutex and condition variable
//            come down to: a stream's thread, a CAF scoped_actor's receive)
//
// and two measures of each:
//
//   eventfd, futex
//            half a ping-pong, the threads where the kernel puts them. It
//            often puts them on one CPU (each wakes the other, then
//            sleeps), a switch between threads: `same_cpu_share` is the
//            share of round trips whose echo woke on the CPU that the
//            first thread then woke on (a sched_getcpu() each, inside the
//            timed loop)
//   eventfd_idle_cpu, futex_idle_cpu
//            the waiter pinned to one CPU, the waker to another; the waker
//            spins a gap between wake-ups (its CPU stays awake, the
//            waiter's goes idle; a little less than the gap, as the waiter
//            returns to its sleep), then stamps CLOCK_MONOTONIC and wakes;
//            the waiter stamps the clock as it returns: one-way, each
//            wake-up timed on its own. A line for each gap of --idle-gaps-us
//            (at least 5 us, so that the waiter is asleep): a CPU idle 10
//            us, and one idle 200 us, as between steps
//
// On a virtual machine an idle vCPU halts: its wake-up is an interrupt the
// host must deliver and a vCPU it must run again, unless the guest polls
// before it halts (the haltpoll cpuidle governor's guest_halt_poll_ns > 0).
// The cpuidle driver, governor and that setting are printed beside the
// figures. Run it on an otherwise idle machine: a busy waiter's CPU is not
// idle.
//
// Prints one JSON object per line. The ping-pongs: the median and 10th
// percentile of the one-way means of --rounds rounds of --iters round trips.
// The idle-CPU kinds: the median, 10th and 90th percentile of --idle-iters
// single wake-ups after a few left out (none where fewer than 2 CPUs are
// allowed).
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
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

enum class Sleep { kEventfd, kFutex };

const char* name_of(Sleep s) { return s == Sleep::kEventfd ? "eventfd" : "futex"; }

void check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
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

// One way to sleep and be woken: an eventfd, or a futex word.
class Channel {
 public:
  explicit Channel(Sleep how) : how_(how), fd_(how == Sleep::kEventfd ? eventfd(0, 0) : -1) {
    check(how_ != Sleep::kEventfd || fd_ >= 0, "eventfd");
  }
  ~Channel() {
    if (fd_ >= 0) close(fd_);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void sleep() {
    if (how_ == Sleep::kFutex) return wait_for(&word_);
    std::uint64_t v = 0;
    check(read(fd_, &v, sizeof(v)) == sizeof(v), "read");
  }
  void wake_up() {
    if (how_ == Sleep::kFutex) return wake(&word_);
    const std::uint64_t v = 1;
    check(write(fd_, &v, sizeof(v)) == sizeof(v), "write");
  }

 private:
  Sleep how_;
  int fd_;
  std::atomic<int> word_{0};
};

struct PingPong {
  double one_way_us = 0;
  int same_cpu = 0;  // round trips whose two threads were on one CPU
};

// A channel each way; `iters` round trips: the one-way mean in us.
PingPong ping_pong(Sleep how, int iters) {
  Channel ping(how), pong(how);
  std::atomic<int> echo_cpu{-1};
  std::thread echo([&] {
    for (int i = 0; i < iters; i++) {
      ping.sleep();
      echo_cpu.store(sched_getcpu(), std::memory_order_relaxed);
      pong.wake_up();
    }
  });
  PingPong r;
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; i++) {
    ping.wake_up();
    pong.sleep();
    if (sched_getcpu() == echo_cpu.load(std::memory_order_relaxed)) r.same_cpu++;
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  echo.join();
  r.one_way_us = us / iters / 2;
  return r;
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

// Wake-ups left out before the timed ones (the waiter's start and first
// placement).
constexpr int kWarmUp = 10;

// `iters` single wake-ups of a waiter on cpus[1] by a waker on cpus[0],
// `gap_us` apart (the waker spins through the gap); each one-way time in us.
std::vector<double> idle_cpu_one_way(Sleep how, const std::vector<int>& cpus, int iters,
                                     int gap_us) {
  Channel channel(how);
  std::atomic<std::int64_t> woke{0};
  const int total = kWarmUp + iters;
  std::thread waiter([&] {
    pin_to(cpus[1]);
    for (int i = 0; i < total; i++) {
      channel.sleep();
      woke.store(monotonic_ns(), std::memory_order_release);
    }
  });
  pin_to(cpus[0]);
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(iters));
  for (int i = 0; i < total; i++) {
    const std::int64_t until = monotonic_ns() + std::int64_t{gap_us} * 1000;
    while (monotonic_ns() < until) {
    }
    // (The waiter stamped once for the wake-up before; it stamps once for
    // this one, after it.)
    woke.store(0, std::memory_order_relaxed);
    const std::int64_t t0 = monotonic_ns();
    channel.wake_up();
    std::int64_t t1 = 0;
    while ((t1 = woke.load(std::memory_order_acquire)) == 0) {
    }
    if (i >= kWarmUp) us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  waiter.join();
  return us;
}

// The first line of a file; "" where it cannot be read.
std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// A JSON string for a name read from sysfs: null where empty or not plain.
std::string json_name(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-';
  });
  return plain ? "\"" + s + "\"" : "null";
}

// A JSON number for a count read from sysfs: null where not all digits.
std::string json_count(const std::string& s) {
  const bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
  return digits ? s : "null";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"one-way thread wake-up through the kernel (eventfd, futex)"};
  int iters = 20000, rounds = 7, idle_iters = 2000;
  std::vector<int> idle_gaps_us{10, 200};
  app.add_option("--iters", iters, "Round trips per round")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  app.add_option("--rounds", rounds, "Rounds (the median and 10th percentile over them)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--idle-iters", idle_iters, "Single wake-ups of a thread on an idle CPU")
      ->capture_default_str()
      ->check(CLI::Range(10, 1000000));
  app.add_option("--idle-gaps-us", idle_gaps_us,
                 "How long its CPU is idle before each, a line for each (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(5, 1000000));
  CLI11_PARSE(app, argc, argv);
  for (const Sleep how : {Sleep::kEventfd, Sleep::kFutex}) {
    std::vector<double> us;
    long same_cpu = 0;
    for (int r = 0; r < rounds; r++) {
      const PingPong p = ping_pong(how, iters);
      us.push_back(p.one_way_us);
      same_cpu += p.same_cpu;
    }
    std::sort(us.begin(), us.end());
    std::printf(
        "{\"bench\": \"wakeup\", \"kind\": \"%s\", \"one_way_us\": %.3f, \"p10_us\": %.3f, "
        "\"same_cpu_share\": %.3f, \"iters\": %d, \"rounds\": %d}\n",
        name_of(how), us[us.size() / 2], us[us.size() / 10],
        static_cast<double>(same_cpu) / (static_cast<double>(iters) * rounds), iters, rounds);
  }
  const std::vector<int> cpus = two_cpus();
  if (cpus.empty()) {
    std::printf("(no idle-CPU wake-up: this process may run on fewer than 2 CPUs)\n");
    return 0;
  }
  // What decides an idle vCPU's wake-up: the cpuidle driver and governor,
  // and the guest's halt polling where the haltpoll governor is there.
  const std::string driver = json_name(read_line("/sys/devices/system/cpu/cpuidle/current_driver"));
  const std::string governor =
      json_name(read_line("/sys/devices/system/cpu/cpuidle/current_governor_ro"));
  const std::string poll_ns =
      json_count(read_line("/sys/module/haltpoll/parameters/guest_halt_poll_ns"));
  for (const Sleep how : {Sleep::kEventfd, Sleep::kFutex}) {
    for (const int gap_us : idle_gaps_us) {
      std::vector<double> us = idle_cpu_one_way(how, cpus, idle_iters, gap_us);
      std::sort(us.begin(), us.end());
      std::printf(
          "{\"bench\": \"wakeup\", \"kind\": \"%s_idle_cpu\", \"one_way_us\": %.3f, "
          "\"p10_us\": %.3f, \"p90_us\": %.3f, \"iters\": %d, \"idle_gap_us\": %d, "
          "\"waker_cpu\": %d, \"waiter_cpu\": %d, \"cpuidle_driver\": %s, "
          "\"cpuidle_governor\": %s, \"guest_halt_poll_ns\": %s}\n",
          name_of(how), us[us.size() / 2], us[us.size() / 10], us[us.size() * 9 / 10], idle_iters,
          gap_us, cpus[0], cpus[1], driver.c_str(), governor.c_str(), poll_ns.c_str());
    }
  }
  return 0;
}
