// ParamLayout lookups: an unknown name is NotFound naming it (lookup,
// try_view), and find/view stop the process in every build type instead of
// dereferencing null.
#include <gtest/gtest.h>

#include "gpu/device.h"
#include "model/config.h"
#include "model/layout.h"

namespace troupe::model {
namespace {

TEST(ParamLayoutLookup, UnknownNameIsNotFoundNamingIt) {
  const ParamLayout lay = ParamLayout::gpt(*preset("tiny"));
  absl::StatusOr<const ParamSpec*> w = lay.lookup("h.0.attn.c_attn.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->name, "h.0.attn.c_attn.weight");
  absl::StatusOr<const ParamSpec*> missing = lay.lookup("h.99.mlp.c_fc.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no parameter 'h.99.mlp.c_fc.weight'"),
            std::string::npos)
      << missing.status();
}

TEST(ParamLayoutLookup, TryViewChecksTheNameAndTheBuffer) {
  const ParamLayout lay = ParamLayout::gpt(*preset("tiny"));
  gpu::Tensor flat = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kF32, {lay.total()});
  absl::StatusOr<gpu::Tensor> w = lay.try_view(flat, "ln_f.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->data<float>(), flat.data<float>() + lay.find("ln_f.weight").offset);
  EXPECT_EQ(lay.try_view(flat, "nope").status().code(), absl::StatusCode::kNotFound);
  gpu::Tensor small = flat.view(0, {lay.total() - 1});
  absl::StatusOr<gpu::Tensor> bad = lay.try_view(small, "ln_f.weight");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("want the layout's flat buffer"), std::string::npos)
      << bad.status();
}

// Release builds compile assert() out: find used to return *nullptr.
TEST(ParamLayoutLookup, FindOfAMissingNameIsAnInvariantErrorInEveryBuild) {
  const ParamLayout lay = ParamLayout::gpt(*preset("tiny"));
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const gpu::InvariantError& e) {
      return std::string(e.what());
    }
    return std::string("nothing thrown");
  };
  EXPECT_EQ(message([&] {
              (void)lay.find("h.99.ln_1.weight");
            }).rfind("internal error in ParamLayout::find: no parameter 'h.99.ln_1.weight'", 0),
            0u);
  gpu::Tensor small = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kF32, {16});
  EXPECT_EQ(message([&] {
              (void)lay.view(small, "ln_f.bias");
            }).rfind("internal error in ParamLayout::view", 0),
            0u);
}

}  // namespace
}  // namespace troupe::model

namespace troupe::model {
namespace {

// local_index inverts global_index: over every parameter of every TP slice
// of a small model, each global element belongs to exactly one slice (a
// replicated one to every slice, at the same index), and maps back.
TEST(ParamSpecIndex, LocalIndexInvertsGlobalIndexAndTheSlicesPartitionTheTensor) {
  GptConfig c = *preset("tiny");
  c.L = 1;
  c.C = 16;
  c.NH = 4;
  c.T = 8;
  c.V = 30;
  c.vocab_multiple = 8;  // Vp = 32 at tp 1, 32 at tp 2 (16 x 2), 32 at tp 4
  for (int tp : {1, 2, 4}) {
    GptConfig s = c;
    s.vocab_multiple = c.vocab_multiple * tp;
    const ParamLayout whole = ParamLayout::gpt(s);
    for (const ParamSpec& w : whole.specs()) {
      std::vector<int> owners(static_cast<std::size_t>(w.numel()), 0);
      for (int t = 0; t < tp; t++) {
        const ParamLayout lay = ParamLayout::gpt(s, StageSpec::whole(s), {tp, t});
        const ParamSpec& p = lay.find(w.name);
        for (std::int64_t i = 0; i < p.numel(); i++) {
          const std::int64_t g = p.global_index(i);
          ASSERT_EQ(p.local_index(g), i) << w.name << " tp " << tp << " t " << t;
          owners[static_cast<std::size_t>(g)]++;
        }
        EXPECT_EQ(p.local_index(w.numel()), -1) << w.name;  // past the tensor
        std::int64_t mine = 0;
        for (std::int64_t g = 0; g < w.numel(); g++) mine += p.local_index(g) >= 0;
        EXPECT_EQ(mine, p.numel()) << w.name << " tp " << tp << " t " << t;
      }
      const int want =
          ParamLayout::gpt(s, StageSpec::whole(s), {tp, 0}).find(w.name).replicated() ? tp : 1;
      for (int n : owners) ASSERT_EQ(n, want) << w.name << " tp " << tp;
    }
  }
}

}  // namespace
}  // namespace troupe::model
