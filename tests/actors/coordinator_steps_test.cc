// The Coordinator's step loop against scripted workers: a step begins with
// the update of the one before it when nothing is due between them (an
// evaluation, a checkpoint, an exit), and the shard holds that begin_step
// until it is ready; where something is due, the next step waits for every
// rank's ready as before.
#include <gtest/gtest.h>

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

// What the scripted rank saw, in order ("u3+": step 3's update with the
// next begin; "u4": without; "b4@3": begin_step 4 while in step 3, held;
// "b4": begun; "r3": ready), and the first sample of every step begun.
struct StepLog {
  std::mutex mu;
  std::vector<std::string> events;
  std::vector<std::int64_t> firsts;
  void add(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
};

// One rank's optimizer, as OptimizerActor: begun by its shard, a norm a
// step; on an update that carries the next step, begin_step to the shard
// first; then the shard's word that its parameters are in.
caf::behavior scripted_optimizer(caf::stateful_actor<caf::actor>* self, caf::actor coordinator,
                                 StepLog* log) {
  return {
      [=](shard_atom, caf::actor shard) { self->state = shard; },
      [=](begin_step_atom, int step, std::int64_t, float) {
        self->send(coordinator, norm_atom::value, step, 0, 1.0);
      },
      [=](update_atom, int step, float, float, int) {
        log->add(absl::StrCat("u", step));
        self->send(self->state, dp_params_atom::value, step);
      },
      [=](update_atom, int step, float, float, int, std::int64_t first, float scale) {
        log->add(absl::StrCat("u", step, "+"));
        self->send(self->state, begin_step_atom::value, step + 1, first, scale);
        self->send(self->state, dp_params_atom::value, step);
      },
      [=](save_atom, int step, const std::string&) {
        self->send(coordinator, snapshot_atom::value, step, 0, std::string());
        self->send(coordinator, saved_atom::value, step, 0, std::string("[]"), std::string());
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
                             caf::actor optimizer, StepLog* log) {
  auto start = [=](int step, std::int64_t first) {
    log->add(absl::StrCat("b", step));
    {
      std::lock_guard<std::mutex> lock(log->mu);
      log->firsts.push_back(first);
    }
    self->state.step = step;
    self->send(optimizer, begin_step_atom::value, step, first, 1.0f);
    self->send(coordinator, loss_atom::value, step, 0, 0, 1.0);
  };
  return {
      [=](begin_step_atom, int step, std::int64_t first, float) {
        if (self->state.step == 0) return start(step, first);
        log->add(absl::StrCat("b", step, "@", self->state.step));
        self->state.held = step;
        self->state.held_first = first;
      },
      [=](dp_params_atom, int step) {
        log->add(absl::StrCat("r", step));
        self->send(coordinator, ready_atom::value, step, 0);
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

// A one-rank run of `steps` steps of one sample each; `stop_after` > 0: a
// host's stop_atom for that step, sent before the run starts.
StepsRun run_steps(int steps, StepLog* log, const std::string& save_dir = "", int save_interval = 0,
                   int stop_after = 0) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system system{cfg};
  std::shared_ptr<CoordinatorSetup> setup = fixtures::one_rank_setup(steps);
  setup->save_dir = save_dir;
  setup->save_interval = save_interval;
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
  const caf::actor optimizer = system.spawn(scripted_optimizer, c, log);
  const caf::actor shard = system.spawn(scripted_shard, c, optimizer, log);
  caf::anon_send(optimizer, shard_atom::value, shard);
  setup->shards = {shard};
  setup->optimizers = {optimizer};
  if (stop_after > 0) caf::anon_send(c, stop_atom::value, stop_after);
  caf::anon_send(c, start_atom::value);
  std::future<absl::Status> f = done.get_future();
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    out.status = absl::DeadlineExceededError("the run never ended");
  } else {
    out.status = f.get();
  }
  for (const caf::actor& a : {shard, optimizer}) {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  std::lock_guard<std::mutex> lock(mu);
  return out;
}

TEST(CoordinatorSteps, AStepBeginsWithTheUpdateBeforeItAndTheShardHoldsIt) {
  StepLog log;
  const StepsRun r = run_steps(4, &log);
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
  const std::string dir =
      (std::filesystem::temp_directory_path() / "troupe_coordinator_steps_test").string();
  std::filesystem::remove_all(dir);
  {
    StepLog log;
    const StepsRun r = run_steps(4, &log, dir, /*save_interval=*/2);
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
    const StepsRun r = run_steps(5, &log, "", 0, /*stop_after=*/2);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.steps, (std::vector<int>{1, 2}));
    EXPECT_EQ(log.events, (std::vector<std::string>{"b1", "u1+", "b2@1", "r1", "b2", "u2", "r2"}));
  }
}

}  // namespace
}  // namespace troupe::actors
