// Checkpoints at the level of model/checkpoint.h: rank files, the commit and
// the reader, against a brute-force reference built here. Every parameter's
// whole tensor holds known values (kind, parameter, element), the writer's
// slices are cut from it by Megatron's tensor-slicing rules written out below
// (not by ParamSpec::global_index, the code under test), and fill() into
// other layouts must give exactly the slices those rules cut for them,
// vocabulary padding rows zero. Then the damage and atomicity cases: each
// error names the file (and tensor) and the problem.
#include "model/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/layout.h"

namespace troupe::model::ckpt {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::int64_t>;

// L=2 C=8 NH=4 T=4 V=10: small enough to check every element, and V is a
// multiple of no padding used here, so every layout has padding rows.
GptConfig small_model(int vocab_multiple) {
  GptConfig c;
  c.name = "ckpt-test";
  c.L = 2;
  c.C = 8;
  c.NH = 4;
  c.T = 4;
  c.V = 10;
  c.vocab_multiple = vocab_multiple;
  return c;
}

// Megatron's tensor slicing (megatron/core/tensor_parallel/layers.py and
// the GPT model's attention), by parameter name.
enum class Rule { kReplicated, kRows, kCols, kQkvHeads };
Rule rule_of(const std::string& name) {
  if (name == "wte.weight") return Rule::kRows;                         // VocabParallelEmbedding
  if (absl::StrContains(name, "attn.c_attn.")) return Rule::kQkvHeads;  // q, k, v by heads
  if (absl::StrContains(name, "mlp.c_fc.")) return Rule::kRows;         // ColumnParallelLinear
  if (absl::EndsWith(name, "c_proj.weight")) return Rule::kCols;        // RowParallelLinear
  return Rule::kReplicated;  // LayerNorms, wpe, row-parallel biases
}

// Rank t of tp's slice of `full` (row-major, `shape`; a 1-D tensor is a
// column), built by copying the rows and columns it keeps in order.
std::vector<float> megatron_slice(const std::vector<float>& full, const Shape& shape, Rule rule,
                                  int tp, int t) {
  const std::int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  std::vector<float> out;
  auto copy_rows = [&](std::int64_t first, std::int64_t n) {
    for (std::int64_t r = first; r < first + n; r++) {
      for (std::int64_t c = 0; c < cols; c++) out.push_back(full[r * cols + c]);
    }
  };
  if (tp == 1 || rule == Rule::kReplicated) return full;
  if (rule == Rule::kRows) copy_rows(t * rows / tp, rows / tp);
  if (rule == Rule::kQkvHeads) {  // the heads t owns, of q, then of k, then of v
    for (int part = 0; part < 3; part++)
      copy_rows(part * rows / 3 + t * rows / 3 / tp, rows / 3 / tp);
  }
  if (rule == Rule::kCols) {
    for (std::int64_t r = 0; r < rows; r++) {
      for (std::int64_t c = t * cols / tp; c < (t + 1) * cols / tp; c++)
        out.push_back(full[r * cols + c]);
    }
  }
  return out;
}

// The whole tensor of parameter number `index` (of `kind`): element e is
// kind*1e6 + index*1e4 + e + 1 (exact in f32), wte's rows from V on zero
// (the padding, in every layout). Row-major numbering does not depend on
// the padding, so this is the reference for any Vp.
std::vector<float> reference_tensor(Kind kind, int index, const GptConfig& cfg,
                                    const std::string& name, const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t e = 0; e < n; e++) {
    const bool padding = name == "wte.weight" && e / shape[1] >= cfg.V;
    v[static_cast<std::size_t>(e)] =
        padding ? 0.0f
                : static_cast<float>(static_cast<int>(kind) * 1000000 + index * 10000 + e + 1);
  }
  return v;
}

int param_index(const GptConfig& cfg, const std::string& name) {
  const ParamLayout whole = ParamLayout::gpt(cfg);
  const std::vector<ParamSpec>& specs = whole.specs();
  for (std::size_t i = 0; i < specs.size(); i++) {
    if (specs[i].name == name) return static_cast<int>(i);
  }
  ADD_FAILURE() << "no parameter " << name;
  return -1;
}

// A chunk's flat buffer of `kind` as the brute-force reference has it: each
// parameter's slice at its offset, the alignment gaps NaN.
std::vector<float> reference_flat(Kind kind, const GptConfig& cfg, const ParamLayout& lay) {
  std::vector<float> flat(static_cast<std::size_t>(lay.total()),
                          std::numeric_limits<float>::quiet_NaN());
  for (const ParamSpec& s : lay.specs()) {
    const Shape full(s.full_shape.begin(), s.full_shape.end());
    const std::vector<float> slice =
        megatron_slice(reference_tensor(kind, param_index(cfg, s.name), cfg, s.name, full), full,
                       rule_of(s.name), s.slice.tp, s.slice.t);
    EXPECT_EQ(static_cast<std::int64_t>(slice.size()), s.numel()) << s.name;
    std::copy(slice.begin(), slice.end(), flat.begin() + s.offset);
  }
  return flat;
}

constexpr Kind kKinds[] = {Kind::kParam, Kind::kMaster, Kind::kAdamM, Kind::kAdamV};

struct Layout {
  int tp = 1, pp = 1, dp = 1;
};

// Writes step `step`'s checkpoint of `cfg` as a run with layout `w` would:
// rank s*(tp*dp) + d*tp + t holds, of stage s, TP slice t, its parameters
// if d = 0, and ZeRO partition d of the flat buffer (ranges that cut
// through parameters) of master, m and v; the last stage's wte is the
// tied copy (not written) when there is more than one stage.
absl::Status write_checkpoint(const std::string& dir, const GptConfig& cfg, Layout w, int step,
                              int keep_last = 0,
                              std::optional<LossScaleState> scaler = std::nullopt) {
  absl::StatusOr<std::string> tmp = begin_save(dir, step);
  if (!tmp.ok()) return tmp.status();
  std::vector<TensorRecord> all;
  for (int s = 0; s < w.pp; s++) {
    for (int d = 0; d < w.dp; d++) {
      for (int t = 0; t < w.tp; t++) {
        const ParamLayout lay = ParamLayout::gpt(cfg, StageSpec::pipeline(cfg, w.pp, s), {w.tp, t});
        std::vector<std::vector<float>> flat;
        for (Kind k : kKinds) flat.push_back(reference_flat(k, cfg, lay));
        const std::int64_t b = d * lay.total() / w.dp, e = (d + 1) * lay.total() / w.dp;
        std::vector<Piece> pieces;
        add_chunk_pieces(lay, /*tied_copy=*/w.pp > 1 && s == w.pp - 1, /*params=*/d == 0, b, e,
                         flat[0].data(), flat[1].data() + b, flat[2].data() + b, flat[3].data() + b,
                         &pieces);
        absl::StatusOr<std::vector<TensorRecord>> r =
            write_rank_file(*tmp, s * w.tp * w.dp + d * w.tp + t, pieces);
        if (!r.ok()) return r.status();
        all.insert(all.end(), r->begin(), r->end());
      }
    }
  }
  Meta meta;
  meta.step = step;
  meta.options.model = cfg;
  meta.tp = w.tp;
  meta.pp = w.pp;
  meta.dp = w.dp;
  meta.writer = writer_name();
  meta.loss_scale = scaler;
  return commit(dir, *tmp, meta, all, keep_last);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            absl::StrCat("troupe_ckpt_", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string iter(int step) const { return absl::StrCat(dir_, "/", iter_name(step)); }
  std::string tracker_text() const {
    std::ifstream in(absl::StrCat(dir_, "/", kTracker));
    std::string s;
    std::getline(in, s);
    return s;
  }

  std::string dir_;
};

// Fills every chunk of layout `r` of `cfg` (the partitions of r.dp cutting
// each flat buffer) and checks every element against the reference; what
// a partition does not cover stays as it was.
void expect_fills_like_reference(const Checkpoint& c, const GptConfig& cfg, Layout r) {
  for (int s = 0; s < r.pp; s++) {
    for (int t = 0; t < r.tp; t++) {
      const ParamLayout lay = ParamLayout::gpt(cfg, StageSpec::pipeline(cfg, r.pp, s), {r.tp, t});
      for (Kind k : kKinds) {
        const std::vector<float> want = reference_flat(k, cfg, lay);
        for (int d = 0; d < r.dp; d++) {
          const std::int64_t b = d * lay.total() / r.dp, e = (d + 1) * lay.total() / r.dp;
          std::vector<float> got(static_cast<std::size_t>(lay.total()), -7.0f);
          ASSERT_TRUE(
              c.fill({.kind = k, .layout = &lay, .begin = b, .end = e, .data = got.data() + b})
                  .ok());
          for (std::int64_t i = 0; i < lay.total(); i++) {
            const float w = i >= b && i < e && !std::isnan(want[i]) ? want[i] : -7.0f;
            ASSERT_EQ(got[i], w) << kind_name(k) << " stage " << s << " t=" << t << " partition "
                                 << d << " element " << i;
          }
        }
      }
    }
  }
}

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
  EXPECT_TRUE(absl::StrContains(st.message(), "/wte.weight are in no rank's file"))
      << st;
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
