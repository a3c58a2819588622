// Hostfiles in DeepSpeed's format, its --include/--exclude filters (the
// examples of DeepSpeed's own documentation of parse_resource_filter), and
// the placement of ranks in Megatron's order.
#include "launcher/hostfile.h"

#include <gtest/gtest.h>

namespace troupe::launcher {
namespace {

std::vector<HostEntry> hosts(absl::string_view text) {
  auto h = parse_hostfile(text, "hostfile");
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : std::vector<HostEntry>{};
}

TEST(Hostfile, EntriesCommentsAndBlankLines) {
  auto h = hosts("# a cluster\nworker-0 slots=4\n\n  worker-1\tslots=2   # two GPUs\n");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].host, "worker-0");
  EXPECT_EQ(h[0].slots, 4);
  EXPECT_EQ(h[0].line, 2);
  EXPECT_EQ(h[1].host, "worker-1");
  EXPECT_EQ(h[1].slots, 2);
  EXPECT_EQ(h[1].line, 4);
}

TEST(Hostfile, BadLinesAreErrorsNamingFileAndLine) {
  struct Case {
    const char* text;
    const char* error;
  } cases[] = {
      {"a slots=2\nb slots=1\na slots=3\n",
       "hostfile:3: host 'a' is listed again (first at line 1)"},
      {"a slots=2\nb\n", "hostfile:2: 'b' is not a hostfile entry (HOST slots=N)"},
      {"a slots=x\n", "hostfile:1: slots=x: not a positive integer"},
      {"a slots=0\n", "hostfile:1: slots=0: not a positive integer"},
      {"a slots=-2\n", "hostfile:1: slots=-2: not a positive integer"},
      {"a slots=99999\n", "hostfile:1: slots=99999: at most 4096 per host"},
      {"a slots=2 gpus=3\n", "hostfile:1: 'a slots=2 gpus=3' is not a hostfile entry"},
      {"# nothing\n\n", "hostfile: no hosts"},
  };
  for (const Case& c : cases) {
    auto h = parse_hostfile(c.text, "hostfile");
    ASSERT_FALSE(h.ok()) << c.text;
    EXPECT_NE(h.status().message().find(c.error), std::string::npos) << h.status();
  }
  EXPECT_TRUE(absl::IsNotFound(read_hostfile("/nonexistent/hostfile").status()));
}

TEST(Hostfile, IncludeAndExcludeAsDeepSpeed) {
  auto h = hosts("worker-0 slots=4\nworker-1 slots=4\nworker-2 slots=2\n");
  // "worker-0@worker-1:0,2": all of worker-0, slots 0 and 2 of worker-1.
  auto inc = filter_slots(h, "worker-0@worker-1:0,2", "");
  ASSERT_TRUE(inc.ok()) << inc.status();
  ASSERT_EQ(inc->size(), 2u);
  EXPECT_EQ((*inc)[0].host, "worker-0");
  EXPECT_EQ((*inc)[0].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ((*inc)[1].slots, (std::vector<int>{0, 2}));
  // "worker-1:0": everything but slot 0 of worker-1; a whole host excluded.
  auto exc = filter_slots(h, "", "worker-1:0@worker-2");
  ASSERT_TRUE(exc.ok()) << exc.status();
  ASSERT_EQ(exc->size(), 2u);
  EXPECT_EQ((*exc)[0].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ((*exc)[1].host, "worker-1");
  EXPECT_EQ((*exc)[1].slots, (std::vector<int>{1, 2, 3}));
  // Hosts keep the hostfile's order whatever the filter's order.
  auto order = filter_slots(h, "worker-2@worker-0:1", "");
  ASSERT_TRUE(order.ok());
  EXPECT_EQ((*order)[0].host, "worker-0");
  EXPECT_EQ((*order)[1].host, "worker-2");
  // Errors.
  EXPECT_NE(filter_slots(h, "worker-0", "worker-1").status().message().find("mutually exclusive"),
            std::string::npos);
  EXPECT_NE(filter_slots(h, "worker-9", "").status().message().find("'worker-9' is not in"),
            std::string::npos);
  EXPECT_NE(filter_slots(h, "worker-2:2", "").status().message().find("has no slot '2'"),
            std::string::npos);
  EXPECT_FALSE(filter_slots(h, "", "worker-0@worker-1@worker-2").ok());  // nothing left
}

TEST(Hostfile, PlacementFillsHostsInRankOrder) {
  auto h = hosts("a slots=2\nb slots=3\n");
  auto slots = filter_slots(h, "", "");
  ASSERT_TRUE(slots.ok());
  auto p = place_ranks(*slots, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  const char* host[] = {"a", "a", "b", "b"};
  const int local[] = {0, 1, 0, 1};
  for (int r = 0; r < 4; r++) {
    EXPECT_EQ((*p)[static_cast<std::size_t>(r)].rank, r);
    EXPECT_EQ((*p)[static_cast<std::size_t>(r)].host, host[r]);
    EXPECT_EQ((*p)[static_cast<std::size_t>(r)].local_rank, local[r]);
  }
  auto too_many = place_ranks(*slots, 6);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("5 slots for 6 ranks"), std::string::npos);
  auto excluded = filter_slots(h, "", "a:0");
  ASSERT_TRUE(excluded.ok());
  auto q = place_ranks(*excluded, 2);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)[0].slot, 1);  // a's slot 0 is excluded: rank 0 uses slot 1
  EXPECT_EQ((*q)[1].host, "b");
}

TEST(Hostfile, HostsFromAList) {
  auto h = hosts_from_list("n1, n2", 4);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)[1].host, "n2");
  EXPECT_EQ((*h)[1].slots, 4);
  EXPECT_FALSE(hosts_from_list("n1,,n2", 1).ok());
  EXPECT_FALSE(hosts_from_list("n1,n1", 1).ok());
}

}  // namespace
}  // namespace troupe::launcher
