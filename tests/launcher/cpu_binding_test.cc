// --bind-cores' shares (launcher/cpu_binding.h: a block each, or one CPU
// each in turn where workers outnumber the CPUs, a core's hardware threads
// together), CPU lists, and that binding a process binds the threads it
// already has.
#include "launcher/cpu_binding.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace troupe::launcher {
namespace {

std::vector<int> iota(int n, int first = 0) {
  std::vector<int> v;
  for (int i = 0; i < n; i++) v.push_back(first + i);
  return v;
}

// CPUs 0..n-1, a core each (a VM's vCPUs; sysfs' fallback).
std::vector<Cpu> flat(const std::vector<int>& ids) {
  std::vector<Cpu> out;
  for (int id : ids) out.push_back({.id = id, .package = 0, .core = id});
  return out;
}

// `packages` x `cores` cores of 2 hardware threads, numbered as Linux does
// on x86: every core's first thread, then every core's second (CPU n and
// n + packages*cores share a core).
std::vector<Cpu> hyperthreaded(int packages, int cores) {
  std::vector<Cpu> out;
  const int n = packages * cores;
  for (int id = 0; id < 2 * n; id++) {
    out.push_back({.id = id, .package = (id % n) / cores, .core = id % cores});
  }
  return out;
}

TEST(CpuShare, NoMoreWorkersThanCpusTakeBlocksThatCoverEveryCpuOnce) {
  EXPECT_EQ(cpu_share(flat(iota(2)), 0, 2), std::vector<int>({0}));
  EXPECT_EQ(cpu_share(flat(iota(2)), 1, 2), std::vector<int>({1}));
  EXPECT_EQ(cpu_share(flat(iota(8)), 1, 4), std::vector<int>({2, 3}));
  // 16 CPUs for 3: 5, 5 and 6.
  EXPECT_EQ(cpu_share(flat(iota(16)), 0, 3), iota(5));
  EXPECT_EQ(cpu_share(flat(iota(16)), 1, 3), iota(5, 5));
  EXPECT_EQ(cpu_share(flat(iota(16)), 2, 3), iota(6, 10));
  // The set's own numbers (a taskset or cgroup's), not 0..C-1.
  EXPECT_EQ(cpu_share(flat({4, 5, 8, 9}), 1, 2), std::vector<int>({8, 9}));
  for (int c = 1; c <= 12; c++) {
    for (int l = 1; l <= c; l++) {
      std::multiset<int> all;
      for (int i = 0; i < l; i++) {
        const std::vector<int> share = cpu_share(flat(iota(c)), i, l);
        EXPECT_FALSE(share.empty()) << c << " CPUs, worker " << i << " of " << l;
        all.insert(share.begin(), share.end());
      }
      const std::vector<int> every = iota(c);
      EXPECT_EQ(all, std::multiset<int>(every.begin(), every.end())) << c << " / " << l;
    }
  }
}

TEST(CpuShare, MoreWorkersThanCpusTakeOneEachInTurn) {
  // (Neighbouring ranks, a pipeline's adjacent stages, on different CPUs.)
  for (int i = 0; i < 8; i++) EXPECT_EQ(cpu_share(flat(iota(2)), i, 8), std::vector<int>({i % 2}));
  EXPECT_EQ(cpu_share(flat({3, 7, 11}), 4, 6), std::vector<int>({7}));
}

TEST(CpuShare, ACoresHardwareThreadsGoTogetherAndOneEachGoesCoreByCore) {
  // 4 cores, CPU n and n+4 on one: two workers take two whole cores each,
  // not every core's first or second thread.
  EXPECT_EQ(cpu_share(hyperthreaded(1, 4), 0, 2), std::vector<int>({0, 1, 4, 5}));
  EXPECT_EQ(cpu_share(hyperthreaded(1, 4), 1, 2), std::vector<int>({2, 3, 6, 7}));
  EXPECT_EQ(cpu_share(hyperthreaded(1, 4), 3, 4), std::vector<int>({3, 7}));
  // Two packages of 2 cores (CPU 0-1 package 0, 2-3 package 1, siblings
  // +4): two workers, a package each.
  EXPECT_EQ(cpu_share(hyperthreaded(2, 2), 0, 2), std::vector<int>({0, 1, 4, 5}));
  EXPECT_EQ(cpu_share(hyperthreaded(2, 2), 1, 2), std::vector<int>({2, 3, 6, 7}));
  // More workers than CPUs: every core's first thread, then the seconds.
  for (int i = 0; i < 16; i++) {
    EXPECT_EQ(cpu_share(hyperthreaded(1, 4), i, 16), std::vector<int>({i % 8}));
  }
  // (The order given does not matter.)
  std::vector<Cpu> shuffled = hyperthreaded(1, 4);
  std::reverse(shuffled.begin(), shuffled.end());
  EXPECT_EQ(cpu_share(shuffled, 0, 2), std::vector<int>({0, 1, 4, 5}));
}

TEST(CpuList, RangesAndSingles) {
  EXPECT_EQ(cpu_list({}), "");
  EXPECT_EQ(cpu_list({0}), "0");
  EXPECT_EQ(cpu_list({0, 1}), "0-1");
  EXPECT_EQ(cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  absl::StatusOr<std::vector<int>> back = parse_cpu_list("0-3,8,10-11\n");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::vector<int>({0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("").value(), std::vector<int>());
  for (const char* bad : {"x", "3-1", "1-", "-1", "0-2,a"}) {
    absl::StatusOr<std::vector<int>> got = parse_cpu_list(bad);
    EXPECT_FALSE(got.ok()) << bad;
    if (!got.ok()) {
      EXPECT_NE(got.status().message().find(bad), std::string::npos);
    }
  }
}

// /proc/self/mountinfo's lines as the kernel writes them (proc(5)), with
// `optional` fields (none, one or more) before the separator.
std::string mount_line(const std::string& root, const std::string& point, const std::string& fstype,
                       const std::string& super, const std::string& optional = "shared:9",
                       const std::string& source = "cgroup", const std::string& device = "0:28") {
  return absl::StrCat("31 23 ", device, " ", root, " ", point, " rw,relatime",
                      optional.empty() ? "" : " ", optional, " - ", fstype, " ", source, " ", super,
                      "\n");
}

// Every mount point on the device the lines give (nothing mounted over).
std::string same_device(const std::string&) { return "0:28"; }

std::vector<std::string> dirs_of(const std::vector<CgroupDir>& got) {
  std::vector<std::string> out;
  for (const CgroupDir& d : got) out.push_back(absl::StrCat(d.mount, " ", d.dir, " ", d.file));
  return out;
}

std::vector<std::string> dirs(const std::string& mountinfo, const std::string& cgroup) {
  return dirs_of(cgroup_cpuset_dirs(mountinfo, cgroup, same_device));
}

TEST(CgroupCpusetDirs, V2WhereverMounted) {
  const std::string cgroup = "0::/user.slice/job.scope\n";
  const std::vector<std::string> at_sys = {
      "/sys/fs/cgroup /sys/fs/cgroup/user.slice/job.scope cpuset.cpus.effective"};
  EXPECT_EQ(dirs(mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw"), cgroup), at_sys);
  // No optional field, two of them, an empty source.
  EXPECT_EQ(dirs(mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw", ""), cgroup), at_sys);
  EXPECT_EQ(dirs(mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw", "shared:9 master:3"), cgroup),
            at_sys);
  EXPECT_EQ(dirs(mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw", "shared:9", ""), cgroup),
            at_sys);
  // Elsewhere (a hybrid host's /sys/fs/cgroup/unified), and a mount point
  // with a space, which mountinfo writes as \040.
  EXPECT_EQ(dirs(mount_line("/", "/mnt/my\\040cg", "cgroup2", "rw,nsdelegate"), cgroup),
            std::vector<std::string>(
                {"/mnt/my cg /mnt/my cg/user.slice/job.scope cpuset.cpus.effective"}));
  // A mount whose root is a cgroup above this one, its name escaped too.
  EXPECT_EQ(dirs(mount_line("/user\\040x.slice", "/cg", "cgroup2", "rw"), "0::/user x.slice/a\n"),
            std::vector<std::string>({"/cg /cg/a cpuset.cpus.effective"}));
  // The root cgroup; names that only begin with "..".
  EXPECT_EQ(dirs(mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw"), "0::/\n"),
            std::vector<std::string>({"/sys/fs/cgroup /sys/fs/cgroup cpuset.cpus.effective"}));
  EXPECT_EQ(
      dirs(mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw"), "0::/a/..b\n"),
      std::vector<std::string>({"/sys/fs/cgroup /sys/fs/cgroup/a/..b cpuset.cpus.effective"}));
  EXPECT_EQ(dirs(mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw"), "0::/..b\n"),
            std::vector<std::string>({"/sys/fs/cgroup /sys/fs/cgroup/..b cpuset.cpus.effective"}));
}

TEST(CgroupCpusetDirs, V1CpusetAndMountRoots) {
  const std::string cgroup = "12:cpu,cpuacct:/docker/abc\n4:cpuset:/docker/abc\n0::/docker/abc\n";
  const std::string mounts =
      mount_line("/", "/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct") +
      mount_line("/docker/abc", "/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset") +
      mount_line("/", "/sys/fs/cgroup/unified", "cgroup2", "rw") +
      mount_line("/other", "/mnt/elsewhere", "cgroup", "rw,cpuset") +  // not this cgroup's
      mount_line("/", "/", "ext4", "rw,cpuset", "shared:1", "/dev/vda1");
  // v2 first; a mount whose root is the cgroup shows it at its mount point.
  EXPECT_EQ(dirs(mounts, cgroup),
            std::vector<std::string>(
                {"/sys/fs/cgroup/unified /sys/fs/cgroup/unified/docker/abc cpuset.cpus.effective",
                 "/sys/fs/cgroup/cpuset /sys/fs/cgroup/cpuset cpuset.effective_cpus"}));
  // A cgroup below the mount's root: its path under it. Co-mounted with
  // another controller.
  EXPECT_EQ(
      dirs(mount_line("/docker", "/cg", "cgroup", "rw,cpu,cpuset"), "3:cpu,cpuset:/docker/abc/t\n"),
      std::vector<std::string>({"/cg /cg/abc/t cpuset.effective_cpus"}));
  // No line for a hierarchy, nothing mounted, or a cgroup outside the
  // process's cgroup namespace ("/../x"): nowhere to look.
  EXPECT_TRUE(dirs(mounts, "12:cpu,cpuacct:/docker/abc\n").empty());
  EXPECT_TRUE(dirs("", cgroup).empty());
  EXPECT_TRUE(dirs("garbage\n- -\n", cgroup).empty());
  EXPECT_TRUE(dirs(mounts, "4:cpuset:/../x\n0::/../x\n").empty());
}

TEST(CgroupCpusetDirs, MountsHiddenByOthersLeftOut) {
  // What a mount point's path reaches is the device there: mountinfo's
  // order is not the stacking (a RHEL host's "/" comes after its cgroup
  // mounts, moved there from the initramfs).
  const std::string rhel =
      mount_line("/", "/sys/fs/cgroup", "tmpfs", "rw", "", "tmpfs", "0:24") +
      mount_line("/", "/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset", "shared:5", "cgroup",
                 "0:31") +
      mount_line("/", "/", "xfs", "rw", "shared:1", "/dev/mapper/cl-root", "253:0");
  const std::map<std::string, std::string> on = {
      {"/", "253:0"}, {"/sys/fs/cgroup", "0:24"}, {"/sys/fs/cgroup/cpuset", "0:31"}};
  auto device = [&](const std::map<std::string, std::string>& at) {
    return [&at](const std::string& path) {
      auto it = at.find(path);
      return it == at.end() ? std::string() : it->second;
    };
  };
  EXPECT_EQ(dirs_of(cgroup_cpuset_dirs(rhel, "4:cpuset:/slurm/job1\n", device(on))),
            std::vector<std::string>({"/sys/fs/cgroup/cpuset /sys/fs/cgroup/cpuset/slurm/job1 "
                                      "cpuset.effective_cpus"}));
  // Two mounts of the cgroup2 hierarchy (one device) at one point: the
  // later, on top. A cgroup mount with another device on top of it: none.
  const std::string two =
      mount_line("/", "/sys/fs/cgroup", "cgroup2", "rw", "", "cgroup2", "0:26") +
      mount_line("/lxc/c1", "/sys/fs/cgroup", "cgroup2", "rw", "", "cgroup2", "0:26");
  const std::map<std::string, std::string> cgroup2_on_top = {{"/sys/fs/cgroup", "0:26"}};
  const std::map<std::string, std::string> tmpfs_on_top = {{"/sys/fs/cgroup", "0:24"}};
  EXPECT_EQ(dirs_of(cgroup_cpuset_dirs(two, "0::/lxc/c1/x\n", device(cgroup2_on_top))),
            std::vector<std::string>({"/sys/fs/cgroup /sys/fs/cgroup/x cpuset.cpus.effective"}));
  EXPECT_TRUE(cgroup_cpuset_dirs(two, "0::/lxc/c1/x\n", device(tmpfs_on_top)).empty());
  // A mount point that cannot be reached (mounted over above it).
  EXPECT_TRUE(cgroup_cpuset_dirs(two, "0::/lxc/c1/x\n", device({})).empty());
}

TEST(CgroupCpus, NearestCgroupWithTheFileUpToTheMount) {
  const std::string mounts = mount_line("/", "/cg", "cgroup2", "rw") +
                             mount_line("/", "/v1/cpuset", "cgroup", "rw,cpuset");
  const std::string cgroup = "0::/a/b/c\n4:cpuset:/a\n";
  std::map<std::string, std::string> files;
  std::vector<std::string> read;
  auto reader = [&](const std::string& path) {
    read.push_back(path);
    auto it = files.find(path);
    return it == files.end() ? std::string() : it->second;
  };
  // The cgroup's own file first; its parents' where it has none.
  files = {{"/cg/a/b/c/cpuset.cpus.effective", "1-2"}, {"/cg/a/cpuset.cpus.effective", "0-3"}};
  EXPECT_EQ(cgroup_cpus(mounts, cgroup, same_device, reader), std::vector<int>({1, 2}));
  files.erase("/cg/a/b/c/cpuset.cpus.effective");
  EXPECT_EQ(cgroup_cpus(mounts, cgroup, same_device, reader), std::vector<int>({0, 1, 2, 3}));
  // Never above the mount point; then v1's cpuset.
  files = {{"/cpuset.cpus.effective", "0"}, {"/v1/cpuset/a/cpuset.effective_cpus", "3"}};
  read.clear();
  EXPECT_EQ(cgroup_cpus(mounts, cgroup, same_device, reader), std::vector<int>({3}));
  EXPECT_EQ(read, std::vector<std::string>(
                      {"/cg/a/b/c/cpuset.cpus.effective", "/cg/a/b/cpuset.cpus.effective",
                       "/cg/a/cpuset.cpus.effective", "/cg/cpuset.cpus.effective",
                       "/v1/cpuset/a/cpuset.effective_cpus"}));
  // A list that does not parse is none.
  files = {{"/cg/a/b/c/cpuset.cpus.effective", "x"}};
  EXPECT_TRUE(cgroup_cpus(mounts, cgroup, same_device, reader).empty());
}

TEST(CgroupCpus, DeviceOfIsMountinfosDevice) {
  // /proc's device as stat gives it is the one mountinfo's /proc line gives
  // (proc, a device of its own, unlike a btrfs root's subvolumes).
  std::ifstream in("/proc/self/mountinfo");
  std::string proc_device;
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() > 4 && f[4] == "/proc") proc_device = f[2];  // the last one is on top
  }
  ASSERT_FALSE(proc_device.empty());
  EXPECT_EQ(device_of("/proc"), proc_device);
  EXPECT_EQ(device_of("/no/such/path/here"), "");
}

TEST(CpuTopology, ThisHostsCpusEachOnce) {
  absl::StatusOr<std::vector<int>> cpus = allowed_cpus();
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  const std::vector<Cpu> topo = cpu_topology(*cpus);
  ASSERT_EQ(topo.size(), cpus->size());
  for (std::size_t i = 0; i < topo.size(); i++) EXPECT_EQ(topo[i].id, (*cpus)[i]);
  // The cgroup's CPUs, where it says, hold this process's.
  const std::vector<int> cgroup = cgroup_cpus();
  for (int cpu : cgroup.empty() ? std::vector<int>() : *cpus) {
    EXPECT_TRUE(std::binary_search(cgroup.begin(), cgroup.end(), cpu)) << cpu;
  }
}

TEST(AllowedCpus, AreThisProcesssAffinity) {
  absl::StatusOr<std::vector<int>> cpus = allowed_cpus();
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> want;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (CPU_ISSET(cpu, &set)) want.push_back(cpu);
  }
  EXPECT_EQ(*cpus, want);
}

// In a child process (the test's own stays as it was): a thread started
// before the binding runs on the bound CPU after it, as does the caller.
TEST(BindProcess, BindsTheThreadsAlreadyThere) {
  absl::StatusOr<std::vector<int>> cpus = allowed_cpus();
  ASSERT_TRUE(cpus.ok() && !cpus->empty());
  if (cpus->size() < 2) GTEST_SKIP() << "one CPU: binding to it would change nothing";
  const int target = cpus->back();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<int> stage{0};
    std::vector<int> seen;
    std::thread early([&] {
      while (stage.load() == 0) std::this_thread::yield();
      absl::StatusOr<std::vector<int>> mine = allowed_cpus();
      if (mine.ok()) seen = *mine;
      stage.store(2);
    });
    const bool bound = bind_process({target}).ok();
    stage.store(1);
    early.join();
    absl::StatusOr<std::vector<int>> caller = allowed_cpus();
    const bool ok = bound && seen == std::vector<int>({target}) && caller.ok() &&
                    *caller == std::vector<int>({target});
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace troupe::launcher
