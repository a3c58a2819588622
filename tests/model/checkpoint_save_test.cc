// The save directory at the level of model/checkpoint.h: a stale temporary
// is removed by the next save and never opened, --keep-last keeps the
// newest and never the tracker's own, a commit over the same step replaces
// it (with and without renameat2's exchange and the directory lock).
#include "tests/model/checkpoint_fixture.h"

namespace troupe::model::ckpt {
namespace {

using namespace checkpoint_fixture;  // NOLINT: the fixture's helpers

TEST_F(CheckpointTest, StaleTemporaryIsRemovedByTheNextSaveAndNeverOpened) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 1).ok());
  // A save a crash interrupted: its rank file written, no manifest.
  absl::StatusOr<std::string> stale = begin_save(dir_, 2);
  ASSERT_TRUE(stale.ok()) << stale.status();
  const GptConfig cfg = small_model(8);
  const ParamLayout lay = ParamLayout::gpt(cfg);
  std::vector<float> flat = reference_flat(Kind::kParam, cfg, lay);
  std::vector<Piece> pieces;
  add_chunk_pieces(lay, false, true, 0, 0, flat.data(), nullptr, nullptr, nullptr, &pieces);
  ASSERT_TRUE(write_rank_file(*stale, 0, pieces).ok());
  fs::create_directories(iter(3) + ".tmp-replaced-1");  // a replace a crash interrupted
  // Neither the temporary nor the save directory opens it.
  EXPECT_FALSE(Checkpoint::open(*stale).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->meta().step, 1);
  // The next save removes both.
  ASSERT_TRUE(write_checkpoint(dir_, cfg, {1, 1, 1}, 4).ok());
  EXPECT_FALSE(fs::exists(*stale));
  EXPECT_FALSE(fs::exists(iter(3) + ".tmp-replaced-1"));
  int entries = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
    EXPECT_FALSE(absl::StrContains(e.path().string(), ".tmp-")) << e.path();
    entries++;
  }
  EXPECT_EQ(entries, 4);  // iter_0000001, iter_0000004, the tracker, the lock
  EXPECT_TRUE(fs::exists(dir_ + "/.troupe-save.lock"));
}

TEST_F(CheckpointTest, KeepLastKeepsTheNewestAndNeverTheTrackersOwn) {
  const GptConfig cfg = small_model(8);
  for (int step : {2, 4, 6}) ASSERT_TRUE(write_checkpoint(dir_, cfg, {1, 1, 1}, step, 2).ok());
  EXPECT_FALSE(fs::exists(iter(2)));
  EXPECT_TRUE(fs::exists(iter(4)));
  EXPECT_TRUE(fs::exists(iter(6)));
  EXPECT_EQ(tracker_text(), "6");
  // A run resumed from an older step saves step 3 into the same directory
  // with --keep-last 1: the newer 4 and 6 are older saves of another run,
  // but the tracker's (3) must stay.
  ASSERT_TRUE(write_checkpoint(dir_, cfg, {1, 1, 1}, 3, 1).ok());
  EXPECT_EQ(tracker_text(), "3");
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->meta().step, 3);
  EXPECT_TRUE(c->verify().ok());
}

TEST_F(CheckpointTest, CommitOverTheSameStepReplacesIt) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 2, 1}, 5).ok());  // 4 rank files
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 5).ok());  // 1
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->meta().describe_layout(), "tp=1 pp=1 dp=1 1f1b");
  EXPECT_FALSE(fs::exists(iter(5) + "/rank_00001.safetensors"));  // nothing of the old one
  EXPECT_TRUE(c->verify().ok());
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
    EXPECT_FALSE(absl::StrContains(e.path().string(), ".tmp-")) << e.path();
  }
  expect_fills_like_reference(*c, small_model(8), {1, 1, 1});
}

// Without RENAME_EXCHANGE (NFS): the old checkpoint is moved aside first,
// and the tracker, which named it, names the newest other complete one for
// that moment (the next save's commit names the new one). The end state is
// the same as with the exchange, and a run holding the directory's lock
// keeps any other out of it.
TEST_F(CheckpointTest, CommitOverTheSameStepWithoutExchangeAndTheDirectoryLock) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 3).ok());
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 2, 1}, 5).ok());
  ::setenv("TROUPE_DEBUG_NO_RENAME_EXCHANGE", "1", 1);
  ::setenv("TROUPE_DEBUG_SAVE_DELAY", "0.3", 1);
  // While the commit is in its window, the tracker names step 3.
  std::string during;
  std::thread watch([&] {
    for (int i = 0; i < 400 && during.empty(); i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!fs::exists(iter(5))) {
        std::ifstream in(dir_ + "/" + kTracker);
        std::getline(in, during);
      }
    }
  });
  const absl::Status st = write_checkpoint(dir_, small_model(8), {1, 1, 1}, 5);
  watch.join();
  ::unsetenv("TROUPE_DEBUG_SAVE_DELAY");
  ::unsetenv("TROUPE_DEBUG_NO_RENAME_EXCHANGE");
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(during, "3") << "the tracker while iter_0000005 was away";
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->meta().step, 5);
  EXPECT_EQ(c->meta().describe_layout(), "tp=1 pp=1 dp=1 1f1b");
  EXPECT_TRUE(fs::exists(iter(3) + "/manifest.json"));
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
    EXPECT_FALSE(absl::StrContains(e.path().string(), ".tmp")) << e.path();
  }
  EXPECT_TRUE(lock_save_dir(dir_).ok());  // held by this process: again is fine
}

}  // namespace
}  // namespace troupe::model::ckpt
