// The Coordinator's save protocol against scripted workers: a rank's
// `saved` (from its writer thread) may arrive before its `snapshot` (from
// its actor), and the run still commits every checkpoint and ends.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>

#include "actors/coordinator.h"
#include "actors/messages.h"
#include "actors/rank/rank.h"
#include "model/checkpoint.h"
#include "tests/actors/coordinator_fixtures.h"

namespace troupe::actors {
namespace {

// One rank's optimizer, begun by its shard: a norm per step, and after the
// update the shard's word that its parameters are in; on save, the file's
// report first and the copy's 50 ms later (the order the writer thread can
// produce).
caf::behavior fake_optimizer(caf::stateful_actor<caf::actor>* self, caf::actor coordinator) {
  return {
      [=](begin_step_atom, int step, std::int64_t, float) {
        self->state = caf::actor_cast<caf::actor>(self->current_sender());
        self->send(coordinator, norm_atom::value, step, 0, 1.0);
      },
      [=](update_atom, int step, float, float, int) {
        self->send(self->state, dp_params_atom::value, step);
      },
      [=](save_atom, int step, const std::string&) {
        self->send(coordinator, saved_atom::value, step, 0, std::string("[]"), std::string());
        self->delayed_send(coordinator, std::chrono::milliseconds(50), snapshot_atom::value, step,
                           0, std::string());
      },
  };
}

// One rank's shard: it begins its optimizer (as ShardActor does), reports
// its loss, and is ready once its parameters are in.
caf::behavior fake_shard(caf::event_based_actor* self, caf::actor coordinator,
                         caf::actor optimizer) {
  return {
      [=](begin_step_atom, int step, std::int64_t first, float scale) {
        self->send(optimizer, begin_step_atom::value, step, first, scale);
        self->send(coordinator, loss_atom::value, step, 0, 0, 1.0);
      },
      [=](dp_params_atom, int step) { self->send(coordinator, ready_atom::value, step, 0); },
  };
}

TEST(CoordinatorSave, AFileReportedBeforeItsCopyStillCommitsAndTheRunEnds) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "troupe_coordinator_save_test").string();
  std::filesystem::remove_all(dir);
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system system{cfg};
  std::shared_ptr<CoordinatorSetup> setup = fixtures::one_rank_setup(3);
  setup->save_dir = dir;
  setup->save_interval = 1;
  std::promise<absl::Status> done;
  setup->on_finish = [&done](absl::Status st) { done.set_value(std::move(st)); };
  caf::actor c = system.spawn<Coordinator>(setup);
  const caf::actor optimizer = system.spawn(fake_optimizer, c);
  const caf::actor shard = system.spawn(fake_shard, c, optimizer);
  setup->shards = {shard};
  setup->optimizers = {optimizer};
  caf::anon_send(c, start_atom::value);
  std::future<absl::Status> f = done.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the run never ended (a snapshot after its file was dropped)";
  EXPECT_TRUE(f.get().ok());
  for (int step = 1; step <= 3; step++) {
    EXPECT_TRUE(
        std::filesystem::exists(dir + "/" + model::ckpt::iter_name(step) + "/manifest.json"))
        << "step " << step;
  }
  for (const caf::actor& a : {shard, optimizer}) {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::actors
