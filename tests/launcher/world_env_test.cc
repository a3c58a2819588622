// Positions from the environments srun, mpirun and torchrun set (the
// variables as their documentation names them), and SLURM host lists as
// `scontrol show hostnames` expands them.
#include "launcher/world_env.h"

#include <gtest/gtest.h>

#include <map>

namespace troupe::launcher {
namespace {

GetEnv env(std::map<std::string, std::string> vars) {
  auto owned = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [owned](const char* name) -> const char* {
    auto it = owned->find(name);
    return it == owned->end() ? nullptr : it->second.c_str();
  };
}

TEST(WorldEnv, NoEngineMeansNoPosition) {
  auto p = world_from_env(env({{"HOME", "/root"}}), {});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());
}

TEST(WorldEnv, Torchrun) {
  auto p = world_from_env(env({{"RANK", "5"},
                               {"WORLD_SIZE", "8"},
                               {"LOCAL_RANK", "1"},
                               {"MASTER_ADDR", "10.0.0.1"},
                               {"MASTER_PORT", "29400"},
                               {"SLURM_PROCID", "0"},  // the outer task's: ignored
                               {"SLURM_NTASKS", "2"}}),
                          {.master_addr = "ignored", .master_port = 1});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->has_value());
  EXPECT_EQ((*p)->rank, 5);
  EXPECT_EQ((*p)->world, 8);
  EXPECT_EQ((*p)->local_rank, 1);
  EXPECT_EQ((*p)->master_addr, "10.0.0.1");
  EXPECT_EQ((*p)->master_port, 29400);
  EXPECT_EQ((*p)->engine, "torchrun");
}

TEST(WorldEnv, MpirunNeedsAMasterFromTheFlag) {
  auto vars = std::map<std::string, std::string>{{"OMPI_COMM_WORLD_RANK", "3"},
                                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}};
  auto none = world_from_env(env(vars), {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("OpenMPI started this worker without a master address"),
            std::string::npos);
  auto p = world_from_env(env(vars), {.master_addr = "head", .master_port = 0});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->rank, 3);
  EXPECT_EQ((*p)->local_rank, 3);
  EXPECT_EQ((*p)->master_addr, "head");
  EXPECT_EQ((*p)->master_port, kDefaultMasterPort);
}

TEST(WorldEnv, SrunTakesTheFirstHostOfTheJob) {
  auto p = world_from_env(env({{"SLURM_PROCID", "7"},
                               {"SLURM_NTASKS", "16"},
                               {"SLURM_LOCALID", "3"},
                               {"SLURM_JOB_NODELIST", "gpu[012-015],login1"}}),
                          {.master_addr = "", .master_port = 6000});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->engine, "SLURM");
  EXPECT_EQ((*p)->rank, 7);
  EXPECT_EQ((*p)->local_rank, 3);
  EXPECT_EQ((*p)->master_addr, "gpu012");
  EXPECT_EQ((*p)->master_port, 6000);
}

TEST(WorldEnv, BadValuesNameTheVariable) {
  struct Case {
    std::map<std::string, std::string> vars;
    const char* error;
  } cases[] = {
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK=x: not a non-negative integer"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}},
       "RANK=2 is not a rank of WORLD_SIZE=2"},
      {{{"RANK", "0"}, {"MASTER_ADDR", "a"}}, "WORLD_SIZE is not set but RANK is"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "n[1-"}},
       "SLURM_JOB_NODELIST: host list 'n[1-': unbalanced brackets"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}},
       "master port 70000 out of range"},
  };
  for (const Case& c : cases) {
    auto p = world_from_env(env(c.vars), {});
    ASSERT_FALSE(p.ok()) << c.error;
    EXPECT_NE(p.status().message().find(c.error), std::string::npos) << p.status();
  }
}

TEST(LocalWorld, EachEnginesVariable) {
  EXPECT_EQ(local_world_from_env(env({})), 1);
  EXPECT_EQ(local_world_from_env(env({{"LOCAL_WORLD_SIZE", "8"}})), 8);
  EXPECT_EQ(local_world_from_env(env({{"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}})), 4);
  EXPECT_EQ(local_world_from_env(env({{"SLURM_NTASKS_PER_NODE", "2"}})), 2);
  EXPECT_EQ(local_world_from_env(env({{"LOCAL_WORLD_SIZE", "3"}, {"SLURM_NTASKS_PER_NODE", "2"}})),
            3);
  EXPECT_EQ(local_world_from_env(env({{"LOCAL_WORLD_SIZE", "0"}})), 1);
  EXPECT_EQ(local_world_from_env(env({{"LOCAL_WORLD_SIZE", "x"}})), 1);
}

TEST(LocalPosition, RankAndCountFromOneEngineTheMostSpecificFirst) {
  auto where = [](std::map<std::string, std::string> vars) {
    absl::StatusOr<std::optional<LocalPosition>> p = local_position_from_env(env(std::move(vars)));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() && p->has_value() ? std::make_pair((*p)->rank, (*p)->workers)
                                    : std::make_pair(-1, -1);
  };
  EXPECT_EQ(where({}), std::make_pair(-1, -1));
  EXPECT_EQ(where({{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}}), std::make_pair(3, 4));
  EXPECT_EQ(where({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}),
            std::make_pair(2, 3));
  EXPECT_EQ(where({{"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "4,2"}}),
            std::make_pair(1, 2));
  // (torchrun inside a SLURM allocation: torchrun's pair, not SLURM's count.)
  EXPECT_EQ(where({{"LOCAL_RANK", "0"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"SLURM_LOCALID", "5"},
                   {"SLURM_NTASKS_PER_NODE", "8"}}),
            std::make_pair(0, 2));
}

TEST(LocalPosition, ARankWithoutItsEnginesCountOrOutsideItIsAnErrorNamingThem) {
  auto error = [](std::map<std::string, std::string> vars) {
    absl::StatusOr<std::optional<LocalPosition>> p = local_position_from_env(env(std::move(vars)));
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : std::string(p.status().message());
  };
  // (LOCAL_RANK with SLURM's count would pair two engines' numbers.)
  EXPECT_EQ(error({{"LOCAL_RANK", "1"}, {"SLURM_NTASKS_PER_NODE", "4"}}),
            "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not set");
  EXPECT_EQ(error({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "0"}}),
            "LOCAL_RANK is set but LOCAL_WORLD_SIZE is 0");
  EXPECT_EQ(error({{"LOCAL_RANK", "x"}, {"LOCAL_WORLD_SIZE", "2"}}),
            "LOCAL_RANK=x: not a non-negative integer");
  EXPECT_EQ(error({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "y"}}),
            "LOCAL_WORLD_SIZE=y: not a non-negative integer");
  EXPECT_EQ(
      error({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}),
      "local rank 3 of 3 workers (OMPI_COMM_WORLD_LOCAL_RANK and OMPI_COMM_WORLD_LOCAL_SIZE)");
  EXPECT_NE(error({{"SLURM_LOCALID", "0"}}).find("SLURM_LOCALID is set but not this node's tasks"),
            std::string::npos);
}

// The UCX transport drops TCP only where the engine says every worker is
// on this host; silence or nonsense keeps it.
TEST(LocalWorld, TheWholeWorldOnThisHostOnlyWhereTheEngineSaysSo) {
  EXPECT_EQ(world_on_this_host(env({}), 4), "");
  EXPECT_EQ(world_on_this_host(env({{"LOCAL_WORLD_SIZE", "4"}}), 4), "LOCAL_WORLD_SIZE=4");
  EXPECT_EQ(world_on_this_host(env({{"LOCAL_WORLD_SIZE", "2"}}), 4), "");  // two hosts of 2
  EXPECT_EQ(world_on_this_host(env({{"LOCAL_WORLD_SIZE", "x"}}), 4), "");
  EXPECT_EQ(world_on_this_host(env({{"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}), 3),
            "OMPI_COMM_WORLD_LOCAL_SIZE=3");
  // torchrun's variable decides before a SLURM allocation's node count.
  EXPECT_EQ(world_on_this_host(env({{"LOCAL_WORLD_SIZE", "2"}, {"SLURM_NNODES", "1"}}), 4), "");
  EXPECT_EQ(world_on_this_host(env({{"SLURM_NNODES", "1"}}), 8), "SLURM_NNODES=1");
  EXPECT_EQ(world_on_this_host(env({{"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_NNODES", "1"}}), 8), "");
}

// srun -n 11 over three nodes without --ntasks-per-node: SLURM sets
// SLURM_TASKS_PER_NODE=4(x2),3 (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES").
TEST(LocalWorld, SlurmsTasksPerNodeByNodeId) {
  auto on = [](const char* node, const char* list = "4(x2),3") {
    return local_world_from_env(env({{"SLURM_TASKS_PER_NODE", list}, {"SLURM_NODEID", node}}));
  };
  EXPECT_EQ(on("0"), 4);
  EXPECT_EQ(on("1"), 4);
  EXPECT_EQ(on("2"), 3);
  EXPECT_EQ(on("3"), 1);  // (past the list)
  EXPECT_EQ(on("0", "2"), 2);
  EXPECT_EQ(on("1", "1,5(x2)"), 5);
  EXPECT_EQ(on("0", "4(x"), 1);
  EXPECT_EQ(on("0", "(x2)"), 1);
  EXPECT_EQ(on("0", "4(x)"), 1);
  EXPECT_EQ(on("2", "4(x2),"), 1);
  EXPECT_EQ(local_world_from_env(env({{"SLURM_TASKS_PER_NODE", "4(x2)"}})), 1);  // no node id
  // The step's list before the job's, and either before the job's
  // --ntasks-per-node (sbatch --ntasks-per-node=8, then srun -n 4 on two nodes).
  EXPECT_EQ(local_world_from_env(env({{"SLURM_NTASKS_PER_NODE", "8"},
                                      {"SLURM_TASKS_PER_NODE", "8(x2)"},
                                      {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                      {"SLURM_NODEID", "1"}})),
            2);
  EXPECT_EQ(local_world_from_env(env({{"SLURM_NTASKS_PER_NODE", "8"},
                                      {"SLURM_TASKS_PER_NODE", "3,1"},
                                      {"SLURM_NODEID", "1"}})),
            1);
}

TEST(SlurmHostlist, ExpandsAsScontrol) {
  using V = std::vector<std::string>;
  struct Case {
    const char* list;
    V hosts;
  } cases[] = {
      {"node1", V{"node1"}},
      {"node[1-3]", V{"node1", "node2", "node3"}},
      {"node[08-11]", V{"node08", "node09", "node10", "node11"}},
      {"a[1,3-4],b", V{"a1", "a3", "a4", "b"}},
      {"r[1-2]-n[0-1]", V{"r1-n0", "r1-n1", "r2-n0", "r2-n1"}},
      {"x[7]", V{"x7"}},
  };
  for (const Case& c : cases) {
    auto h = expand_slurm_hostlist(c.list);
    ASSERT_TRUE(h.ok()) << c.list << ": " << h.status();
    EXPECT_EQ(*h, c.hosts) << c.list;
  }
  for (const char* bad : {"n[1-", "n]1", "n[3-1]", "n[a-b]", "n[[1]]", "a,,b", "n[1-1000000000]"})
    EXPECT_FALSE(expand_slurm_hostlist(bad, 1000).ok()) << bad;
  // 90,000 hosts: over the default bound of 65,536, refused before it is
  // built (a list of products once made SLURM_JOB_NODELIST cost seconds:
  // found by the world_env fuzz target).
  auto big = expand_slurm_hostlist("n[1-300]x[1-300]");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("too many hosts"), std::string::npos);
}

}  // namespace
}  // namespace troupe::launcher
