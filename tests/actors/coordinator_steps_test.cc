// The Coordinator's step loop against scripted workers: a step begins with
// the update of the one before it when nothing is due between them (an
// evaluation, a checkpoint, an exit), and the shard holds that begin_step
// until it is ready; where something is due, the next step waits for every
// rank's ready as before.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actors/coordinator.h"
#include "actors/messages.h"
#include "actors/rank/rank.h"
#include "model/checkpoint.h"
#include "tests/actors/coordinator_fixtures.h"

namespace troupe::actors {
namespace {

// What the scripted ranks saw, in order ("u3+": step 3's update with the
// next begin; "u4": without; "b4@3": begin_step 4 while in step 3, held;
// "b4": begun; "r3": ready; with several ranks also "n4": step 4's norm
// sent, each with the rank's prefix), and the first sample of every step
// rank 0 began.
struct StepLog {
  std::mutex mu;
  std::vector<std::string> events;
  std::vector<std::int64_t> firsts;
  void add(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
};

// A scripted rank: its global rank (= its replica d: these runs are data
// parallel only) and the prefix of its log entries. `hold_step1`: its
// optimizer keeps step 1's new parameters from its shard until another
// rank's optimizer says go (go_atom), after that one's step-2 norm.
struct Script {
  int rank = 0;
  std::string prefix = "";
  bool hold_step1 = false;
};

using go_atom = caf::atom_constant<caf::atom("go")>;

struct ScriptedOptimizer {
  caf::actor shard;
  caf::actor held;  // told go after this rank's step-2 norm
  bool go = false, holding = false;
};

// One rank's optimizer, as OptimizerActor: begun by its shard, a norm a
// step; on an update that carries the next step, begin_step to the shard
// first; then the shard's word that its parameters are in.
caf::behavior scripted_optimizer(caf::stateful_actor<ScriptedOptimizer>* self,
                                 caf::actor coordinator, StepLog* log, Script me) {
  auto params_in = [=](int step) {
    if (step == 1 && me.hold_step1 && !self->state.go) {
      self->state.holding = true;
      return;
    }
    self->send(self->state.shard, dp_params_atom::value, step);
  };
  return {
      [=](shard_atom, caf::actor shard) { self->state.shard = shard; },
      [=](go_atom, caf::actor held) { self->state.held = held; },
      [=](go_atom) {
        self->state.go = true;
        if (std::exchange(self->state.holding, false)) params_in(1);
      },
      [=](begin_step_atom, int step, std::int64_t, float) {
        if (!me.prefix.empty()) log->add(absl::StrCat(me.prefix, "n", step));
        self->send(coordinator, norm_atom::value, step, me.rank, 1.0);
        if (step == 2 && self->state.held) self->send(self->state.held, go_atom::value);
      },
      [=](update_atom, int step, float, float, int) {
        log->add(absl::StrCat(me.prefix, "u", step));
        params_in(step);
      },
      [=](update_atom, int step, float, float, int, std::int64_t first, float scale) {
        log->add(absl::StrCat(me.prefix, "u", step, "+"));
        self->send(self->state.shard, begin_step_atom::value, step + 1, first, scale);
        params_in(step);
      },
      [=](save_atom, int step, const std::string&) {
        self->send(coordinator, snapshot_atom::value, step, me.rank, std::string());
        self->send(coordinator, saved_atom::value, step, me.rank, std::string("[]"), std::string());
      },
  };
}

struct ScriptedShardState {
  int step = 0;  // 0: between steps
  int held = 0;
  std::int64_t held_first = 0;
};

// One rank's shard, as ShardActor: a begin_step during a step is held
// until the shard is ready.
caf::behavior scripted_shard(caf::stateful_actor<ScriptedShardState>* self, caf::actor coordinator,
                             caf::actor optimizer, StepLog* log, Script me) {
  auto start = [=](int step, std::int64_t first) {
    log->add(absl::StrCat(me.prefix, "b", step));
    if (me.rank == 0) {
      std::lock_guard<std::mutex> lock(log->mu);
      log->firsts.push_back(first);
    }
    self->state.step = step;
    // (The loss first: in the coordinator's mailbox before anything the
    // optimizer's begin causes.)
    self->send(coordinator, loss_atom::value, step, me.rank, 0, 1.0);
    self->send(optimizer, begin_step_atom::value, step, first, 1.0f);
  };
  return {
      [=](begin_step_atom, int step, std::int64_t first, float) {
        if (self->state.step == 0) return start(step, first);
        log->add(absl::StrCat(me.prefix, "b", step, "@", self->state.step));
        self->state.held = step;
        self->state.held_first = first;
      },
      [=](dp_params_atom, int step) {
        log->add(absl::StrCat(me.prefix, "r", step));
        self->send(coordinator, ready_atom::value, step, me.rank);
        self->state.step = 0;
        if (self->state.held != 0)
          start(std::exchange(self->state.held, 0), self->state.held_first);
      },
  };
}

struct StepsRun {
  absl::Status status;
  std::vector<int> steps;  // of the metrics reported, in order
  std::vector<double> step_s;
};

struct RunOptions {
  int steps = 4;
  std::string save_dir = "";  // no checkpoints
  int save_interval = 0;
  int stop_after = 0;  // > 0: a host's stop_atom for that step, sent before the start
  // dp replicas, one rank each; with 2, rank 1 is `second`.
  int dp = 1;
  Script second{.rank = 1};
};

// A run of one-sample micro-batches, one a replica and step, on scripted
// ranks.
StepsRun run_steps(const RunOptions& o, StepLog* log) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system system{cfg};
  std::shared_ptr<CoordinatorSetup> setup = fixtures::one_rank_setup(o.steps);
  setup->options.global_batch = o.dp;
  setup->meta.options = setup->options;
  setup->layout = {.tp = 1, .pp = 1, .dp = o.dp};
  setup->shape = setup->layout;
  setup->save_dir = o.save_dir;
  setup->save_interval = o.save_interval;
  StepsRun out;
  std::mutex mu;
  setup->on_step = [&](const model::StepMetrics& m) {
    std::lock_guard<std::mutex> lock(mu);
    out.steps.push_back(m.step);
    out.step_s.push_back(m.step_s);
  };
  std::promise<absl::Status> done;
  setup->on_finish = [&done](absl::Status st) { done.set_value(std::move(st)); };
  caf::actor c = system.spawn<Coordinator>(setup);
  std::vector<caf::actor> actors{c};
  for (int r = 0; r < o.dp; r++) {
    const Script me = r == 0 ? Script{.prefix = o.dp > 1 ? "0:" : ""} : o.second;
    const caf::actor optimizer = system.spawn(scripted_optimizer, c, log, me);
    const caf::actor shard = system.spawn(scripted_shard, c, optimizer, log, me);
    caf::anon_send(optimizer, shard_atom::value, shard);
    setup->shards.push_back(shard);
    setup->optimizers.push_back(optimizer);
    actors.insert(actors.end(), {shard, optimizer});
  }
  if (o.dp > 1 && o.second.hold_step1) {
    caf::anon_send(setup->optimizers[0], go_atom::value, setup->optimizers[1]);
  }
  if (o.stop_after > 0) caf::anon_send(c, stop_atom::value, o.stop_after);
  caf::anon_send(c, start_atom::value);
  std::future<absl::Status> f = done.get_future();
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    out.status = absl::DeadlineExceededError("the run never ended");
  } else {
    out.status = f.get();
  }
  // (The coordinator too: after a timeout it is still up, and the
  // system's end would wait for it.)
  for (const caf::actor& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  system.await_all_actors_done();  // (their callbacks hold `done`, `mu` and `out`)
  return out;
}

TEST(CoordinatorSteps, AStepBeginsWithTheUpdateBeforeItAndTheShardHoldsIt) {
  StepLog log;
  const StepsRun r = run_steps({.steps = 4}, &log);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, (std::vector<int>{1, 2, 3, 4}));
  // Steps 2-4 began with the update before them, during it; the last
  // update carries none.
  EXPECT_EQ(log.events,
            (std::vector<std::string>{"b1", "u1+", "b2@1", "r1", "b2", "u2+", "b3@2", "r2", "b3",
                                      "u3+", "b4@3", "r3", "b4", "u4", "r4"}));
  EXPECT_EQ(log.firsts, (std::vector<std::int64_t>{0, 1, 2, 3}));  // the samples before each
  for (double s : r.step_s) EXPECT_GT(s, 0.0);
}

TEST(CoordinatorSteps, ACheckpointOrAStopWaitsForEveryRankAtItsBoundary) {
  const std::string dir = testing::TempDir() + "/troupe_coordinator_steps_test";
  std::filesystem::remove_all(dir);
  {
    StepLog log;
    const StepsRun r = run_steps({.steps = 4, .save_dir = dir, .save_interval = 2}, &log);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.steps, (std::vector<int>{1, 2, 3, 4}));
    // Step 2 saves: step 3 begins once it is committed, not with the update.
    EXPECT_EQ(log.events, (std::vector<std::string>{"b1", "u1+", "b2@1", "r1", "b2", "u2", "r2",
                                                    "b3", "u3+", "b4@3", "r3", "b4", "u4", "r4"}));
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + model::ckpt::iter_name(2) + "/manifest.json"));
  }
  std::filesystem::remove_all(dir);
  {
    StepLog log;
    const StepsRun r = run_steps({.steps = 5, .stop_after = 2}, &log);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.steps, (std::vector<int>{1, 2}));
    EXPECT_EQ(log.events, (std::vector<std::string>{"b1", "u1+", "b2@1", "r1", "b2", "u2", "r2"}));
  }
}

// Two replicas; rank 1's optimizer keeps step 1's new parameters from its
// shard until rank 0's optimizer has sent its step-2 norm. So rank 0, ready,
// begins step 2 (which came with step 1's update), and its step-2 loss and
// norm are in the coordinator's mailbox before rank 1's step-1 ready: the
// coordinator counts them for step 2 and ends step 1 when rank 1 is ready.
TEST(CoordinatorSteps, ARanksNextStepMayReportBeforeAnotherRankEndsThisOne) {
  StepLog log;
  const StepsRun r = run_steps(
      {.steps = 3, .dp = 2, .second = {.rank = 1, .prefix = "1:", .hold_step1 = true}}, &log);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, (std::vector<int>{1, 2, 3}));
  const auto at = [&](const std::string& e) {
    return std::find(log.events.begin(), log.events.end(), e) - log.events.begin();
  };
  ASSERT_LT(at("1:r1"), static_cast<std::ptrdiff_t>(log.events.size())) << log.events.size();
  EXPECT_LT(at("0:n2"), at("1:r1"));  // rank 0's step-2 norm went first
  EXPECT_LT(at("1:r1"), at("1:b2"));
  EXPECT_LT(at("1:n2"), at("0:u2+"));  // step 2's update waited for rank 1's norm
}

}  // namespace
}  // namespace troupe::actors
