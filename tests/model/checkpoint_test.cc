// Checkpoints at the level of model/checkpoint.h: rank files, the commit and
// the reader, against a brute-force reference built here. Every parameter's
// whole tensor holds known values (kind, parameter, element), the writer's
// slices are cut from it by Megatron's tensor-slicing rules written out below
// (not by ParamSpec::global_index, the code under test), and fill() into
// other layouts must give exactly the slices those rules cut for them,
// vocabulary padding rows zero. Then the damage and atomicity cases: each
// error names the file (and tensor) and the problem.
#include "tests/model/checkpoint_fixture.h"

namespace troupe::model::ckpt {
namespace {

using namespace checkpoint_fixture;  // NOLINT: the fixture's helpers

TEST_F(CheckpointTest, RoundTripAndReshardMatchBruteForceSlices) {
  // Written with tp2 pp2 dp2 and Vp 16 (padding 8); read back into the same
  // layout, tp4 with Vp 12, tp1 with Vp 32, pp2 and three ZeRO partitions.
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 2, 2}, 3).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dir(), iter(3));
  EXPECT_EQ(c->meta().step, 3);
  EXPECT_EQ(c->meta().describe_layout(), "tp=2 pp=2 dp=2 1f1b");
  EXPECT_TRUE(c->verify().ok());
  EXPECT_EQ(tracker_text(), "3");
  expect_fills_like_reference(*c, small_model(8), {2, 2, 2});
  expect_fills_like_reference(*c, small_model(4), {4, 1, 1});
  expect_fills_like_reference(*c, small_model(32), {1, 1, 1});
  expect_fills_like_reference(*c, small_model(8), {1, 2, 3});
  expect_fills_like_reference(*c, small_model(4), {4, 2, 3});
}

TEST_F(CheckpointTest, GlobalTensorIsTheWholeReferenceTensor) {
  const GptConfig cfg = small_model(8);
  ASSERT_TRUE(write_checkpoint(dir_, cfg, {2, 1, 1}, 1).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(iter(1));
  ASSERT_TRUE(c.ok()) << c.status();
  const ParamLayout whole = ParamLayout::gpt(cfg);
  for (const std::string name : {"wte.weight", "h.1.attn.c_attn.weight", "h.0.mlp.c_proj.weight"}) {
    Shape shape;
    absl::StatusOr<std::vector<float>> g = c->global_tensor(Kind::kAdamV, name, &shape);
    ASSERT_TRUE(g.ok()) << g.status();
    const ParamSpec& spec = whole.find(name);
    const Shape full(spec.full_shape.begin(), spec.full_shape.end());
    EXPECT_EQ(shape, full) << name;
    EXPECT_EQ(*g, reference_tensor(Kind::kAdamV, param_index(cfg, name), cfg, name, full)) << name;
  }
}

// The rank file's last tensor: the one whose bytes end the file.
std::string last_tensor_of(const std::string& path) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::open(path, SafetensorsFile::Read::kHeader);
  EXPECT_TRUE(f.ok()) << f.status();
  const SafetensorsEntry* last = &f->entries().front();
  for (const SafetensorsEntry& e : f->entries()) {
    if (e.end > last->end) last = &e;
  }
  return last->name;
}

TEST_F(CheckpointTest, DamagedTensorIsDataLossNamingFileAndTensor) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 2, 2}, 2).ok());
  // Rank 2: d=1 s=0 t=0, a ZeRO partition of TP slice 0, whose pieces a
  // load always reads (a replicated parameter's t>0 copies are only verified).
  const std::string file = iter(2) + "/rank_00002.safetensors";
  const std::string tensor = last_tensor_of(file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char byte = static_cast<char>(f.get() ^ 0x40);
    f.seekp(-1, std::ios::end);
    f.put(byte);
  }
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);  // sizes are right: opens
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Status st = c->verify();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(
      absl::StrContains(st.message(), "rank_00002.safetensors: tensor " + tensor + " is damaged"))
      << st;
  // Loading the damaged tensor fails the same way.
  const GptConfig cfg = small_model(8);
  const ParamLayout lay = ParamLayout::gpt(cfg);
  std::vector<float> buf(static_cast<std::size_t>(lay.total()));
  const std::string kind = tensor.substr(0, tensor.find('/'));
  Kind k = Kind::kParam;
  for (Kind x : kKinds) {
    if (kind == kind_name(x)) k = x;
  }
  const absl::Status fill =
      c->fill({.kind = k, .layout = &lay, .begin = 0, .end = lay.total(), .data = buf.data()});
  EXPECT_EQ(fill.code(), absl::StatusCode::kDataLoss) << fill;
  EXPECT_TRUE(absl::StrContains(fill.message(), "rank_00002.safetensors: tensor " + tensor))
      << fill;
}

TEST_F(CheckpointTest, MissingRankFileIsNamed) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 2, 2}, 2).ok());
  fs::remove(iter(2) + "/rank_00005.safetensors");
  const absl::Status st = Checkpoint::open(dir_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), iter(2) + "/rank_00005.safetensors: missing")) << st;
}

TEST_F(CheckpointTest, TruncatedRankFileIsNamed) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 2, 2}, 2).ok());
  const std::string file = iter(2) + "/rank_00006.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);
  // The header promises more bytes than there are: open or verify says so,
  // naming the file.
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  const absl::Status st = c.ok() ? c->verify() : c.status();
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), "rank_00006.safetensors")) << st;
}

TEST_F(CheckpointTest, AnotherModelNamesEveryDifference) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 1).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->check_model(small_model(128)).ok());  // the padding may differ
  GptConfig other = small_model(8);
  other.L = 4;
  other.C = 16;
  other.NH = 2;
  other.T = 32;
  other.V = 50;
  const absl::Status st = c->check_model(other);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* diff :
       {"--layers 4 here, 2 in the checkpoint", "--channels 16 here, 8", "--heads 2 here, 4",
        "--seq-len 32 here, 4", "--vocab-size 50 here, 10"}) {
    EXPECT_TRUE(absl::StrContains(st.message(), diff)) << diff << " not in: " << st;
  }
  EXPECT_TRUE(absl::StrContains(st.message(), iter(1))) << st;
}

TEST_F(CheckpointTest, ResumeWithOtherDataNamesEveryDifference) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 1).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  TrainOptions o = c->meta().options;  // as written: global batch 0, seed 1234, synthetic data
  EXPECT_TRUE(c->check_resume(o).ok());
  o.global_batch = 16;
  o.seed = 7;
  o.split = "90,10,0";
  o.data_path = {"corpus"};
  o.shuffle = false;
  const absl::Status st = c->check_resume(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* diff : {"--global-batch-size 16 here, 0 in the checkpoint",
                           "--seed 7 here, 1234", "--split 90,10,0 here, 969,30,1",
                           "--data-path \"corpus\" here, \"\"", "--no-shuffle differs"}) {
    EXPECT_TRUE(absl::StrContains(st.message(), diff)) << diff << " not in: " << st;
  }
}

// The optimizer's settings and the LR schedule, as Megatron's scheduler
// checks them (a regression: a resume with another --lr went on silently).
TEST_F(CheckpointTest, ResumeWithOtherOptimizerSettingsNamesEveryDifference) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 1).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  TrainOptions o = c->meta().options;
  o.lr.lr = 0.1f;
  o.lr.warmup_iters = 5;
  o.lr.decay_iters = 99;
  o.adam.beta2 = 0.999f;
  o.adam.weight_decay = 0.5f;
  o.clip_grad = 2.0f;
  o.activations.precision = gpu::Precision::kFp16;  // (its loss scale is the run's state)
  o.steps = 1000;  // (more steps alone are fine: the schedule is --lr-decay-iters')
  const absl::Status st = c->check_resume(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* diff :
       {"--lr 0.1 here", "--lr-warmup-iters 5 here", "--lr-decay-iters (default: --steps) 99 here",
        "--adam-beta2 0.999", "--weight-decay 0.5 here", "--clip-grad 2 here",
        "the precision fp16 here (--bf16, --fp16), fp32 in the checkpoint"}) {
    EXPECT_TRUE(absl::StrContains(st.message(), diff)) << diff << " not in: " << st;
  }
  o = c->meta().options;
  o.steps = 1000;
  EXPECT_TRUE(c->check_resume(o).ok());
}

// The loss scaler's state travels in the manifest; a manifest without it
// (older troupes) gives none, so a resume starts a fresh scaler.
TEST_F(CheckpointTest, LossScalerStateRoundTripsAndIsAbsentFromOlderManifests) {
  const LossScaleState s{.scale = 0x1p20f,
                         .growth_tracker = 7,
                         .hysteresis_tracker = -1,
                         .skipped_iters = 3,
                         .skipped_samples = 24};
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 2, 0, s).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->meta().loss_scale.has_value());
  EXPECT_EQ(*c->meta().loss_scale, s);
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 3).ok());
  c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->meta().loss_scale.has_value());
}

// A manifest that claims a vast tensor is refused from what it says, before
// anything is read or allocated (a regression: loading allocated the claimed
// global tensor and died of bad_alloc).
TEST_F(CheckpointTest, AManifestClaimingAVastTensorIsAnErrorNotAnAllocation) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 1, 1}, 1).ok());
  const std::string path = iter(1) + "/manifest.json";
  nlohmann::json j;
  std::ifstream(path) >> j;
  for (nlohmann::json& t : j["tensors"]) {
    if (t["param"] != "wte.weight") continue;
    const std::int64_t tp = t["tp"];
    t["global_shape"] = {std::int64_t{1} << 20, std::int64_t{1} << 20};
    t["slice_shape"] = {(std::int64_t{1} << 20) / tp, std::int64_t{1} << 20};
  }
  std::ofstream(path, std::ios::trunc) << j.dump();
  const absl::Status st = Checkpoint::open(dir_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "manifest.json: ")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "/wte.weight are in no rank's file")) << st;
  // A record naming a file that is not one of its rank files, too.
  std::ifstream(path) >> j;
  j["tensors"][0]["file"] = "../../etc/passwd";
  std::ofstream(path, std::ios::trunc) << j.dump();
  const absl::Status other = Checkpoint::open(dir_).status();
  EXPECT_TRUE(absl::StrContains(other.message(), "names \"../../etc/passwd\", not one of its"))
      << other;
}

TEST_F(CheckpointTest, NotACheckpointIsNamed) {
  fs::create_directories(dir_ + "/empty");
  absl::Status st = Checkpoint::open(dir_ + "/empty").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(st.message(), dir_ + "/empty: not a checkpoint (no manifest.json)"))
      << st;
  std::ofstream(dir_ + "/file") << "x";
  st = Checkpoint::open(dir_ + "/file").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), dir_ + "/file: not a checkpoint directory")) << st;
  st = Checkpoint::open(dir_ + "/nothing").status();
  EXPECT_TRUE(absl::StrContains(st.message(), dir_ + "/nothing: does not exist")) << st;
  // A manifest that is not JSON names the manifest.
  fs::create_directories(dir_ + "/bad");
  std::ofstream(dir_ + "/bad/manifest.json") << "{\"format_version\": 1,";
  st = Checkpoint::open(dir_ + "/bad").status();
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), dir_ + "/bad/manifest.json")) << st;
}

TEST_F(CheckpointTest, TrackerNamingAMissingIterationIsNamed) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {1, 1, 1}, 1).ok());
  std::ofstream(absl::StrCat(dir_, "/", kTracker)) << "9\n";
  absl::Status st = Checkpoint::open(dir_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      absl::StrContains(st.message(), absl::StrCat(dir_, "/", kTracker, " names iteration 9 but ",
                                                   iter(9), " is not a complete checkpoint")))
      << st;
  std::ofstream(absl::StrCat(dir_, "/", kTracker)) << "nine";
  st = Checkpoint::open(dir_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "not an iteration number: \"nine\"")) << st;
  EXPECT_TRUE(Checkpoint::open(iter(1)).ok());  // the checkpoint itself still opens
}

TEST_F(CheckpointTest, RecordsTextRoundTripsAndBadTextIsAnError) {
  ASSERT_TRUE(write_checkpoint(dir_, small_model(8), {2, 1, 1}, 1).ok());
  absl::StatusOr<Checkpoint> c = Checkpoint::open(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::vector<TensorRecord>> back = records_from_text(records_to_text(c->records()));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), c->records().size());
  for (std::size_t i = 0; i < back->size(); i++) {
    const TensorRecord &a = (*back)[i], &b = c->records()[i];
    EXPECT_EQ(std::tie(a.file, a.name, a.param, a.global_shape, a.slice_shape, a.tp, a.t, a.begin,
                       a.end, a.crc32),
              std::tie(b.file, b.name, b.param, b.global_shape, b.slice_shape, b.tp, b.t, b.begin,
                       b.end, b.crc32));
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.split, b.split);
  }
  for (const char* bad :
       {"", "not json", "{\"a\": 1}", "[1, 2]", "[{\"file\": \"rank_00000.safetensors\"}]"}) {
    absl::StatusOr<std::vector<TensorRecord>> r = records_from_text(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << bad << "': " << r.status();
  }
}

}  // namespace
}  // namespace troupe::model::ckpt
