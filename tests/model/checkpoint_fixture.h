// The fixture of the checkpoint tests (checkpoint_test.cc, the reader
// against a brute-force reference; checkpoint_save_test.cc, the save
// directory): a small model, Megatron's tensor-slicing rules written out,
// the reference values of every tensor, and a writer of whole checkpoints.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/checkpoint.h"
#include "model/layout.h"

namespace troupe::model::ckpt::checkpoint_fixture {

namespace fs = std::filesystem;
using Shape = std::vector<std::int64_t>;

// L=2 C=8 NH=4 T=4 V=10: small enough to check every element, and V is a
// multiple of no padding used here, so every layout has padding rows.
inline GptConfig small_model(int vocab_multiple) {
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
inline Rule rule_of(const std::string& name) {
  if (name == "wte.weight") return Rule::kRows;                         // VocabParallelEmbedding
  if (absl::StrContains(name, "attn.c_attn.")) return Rule::kQkvHeads;  // q, k, v by heads
  if (absl::StrContains(name, "mlp.c_fc.")) return Rule::kRows;         // ColumnParallelLinear
  if (absl::EndsWith(name, "c_proj.weight")) return Rule::kCols;        // RowParallelLinear
  return Rule::kReplicated;  // LayerNorms, wpe, row-parallel biases
}

// Rank t of tp's slice of `full` (row-major, `shape`; a 1-D tensor is a
// column), built by copying the rows and columns it keeps in order.
inline std::vector<float> megatron_slice(const std::vector<float>& full, const Shape& shape,
                                         Rule rule, int tp, int t) {
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
inline std::vector<float> reference_tensor(Kind kind, int index, const GptConfig& cfg,
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

inline int param_index(const GptConfig& cfg, const std::string& name) {
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
inline std::vector<float> reference_flat(Kind kind, const GptConfig& cfg, const ParamLayout& lay) {
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
inline absl::Status write_checkpoint(const std::string& dir, const GptConfig& cfg, Layout w,
                                     int step, int keep_last = 0,
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
inline void expect_fills_like_reference(const Checkpoint& c, const GptConfig& cfg, Layout r) {
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

}  // namespace troupe::model::ckpt::checkpoint_fixture
