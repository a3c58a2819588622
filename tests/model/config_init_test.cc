// Model presets, configuration checks, Philox and the counter-based init.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/config.h"
#include "model/gpt.h"
#include "model/init.h"
#include "model/layout.h"

namespace troupe::model {
namespace {

TEST(Config, PresetsHaveTheirPublishedSizes) {
  EXPECT_EQ(preset("gpt2-124m")->num_parameters(), 124439808);  // Hugging Face gpt2
  EXPECT_EQ(preset("gpt2-350m")->num_parameters(), 354823168);  // gpt2-medium
  auto mt = preset("mt-nlg-530b");
  EXPECT_EQ(mt->L, 105);
  EXPECT_EQ(mt->C, 20480);
  EXPECT_EQ(mt->NH, 128);
  EXPECT_NEAR(mt->num_parameters() / 1e9, 530, 1);
  auto small = preset("cpu-small");
  EXPECT_EQ(small->Vp(), 50304);
  EXPECT_EQ(preset("tiny")->Vp(), 512);
}

TEST(Config, UnknownNameListsTheKnownOnes) {
  auto c = preset("gpt5");
  ASSERT_TRUE(absl::IsNotFound(c.status()));
  EXPECT_NE(c.status().message().find("tiny, cpu-small"), absl::string_view::npos);
}

TEST(Config, ValidateNamesTheFlag) {
  GptConfig c = *preset("tiny");
  c.NH = 5;
  EXPECT_EQ(c.validate().message(), "--channels 64 is not a multiple of --heads 5");
  c = *preset("tiny");
  c.L = 0;
  EXPECT_EQ(c.validate().message(), "--layers must be positive, is 0");
}

// Known-answer vectors of Philox4x32-10 from the Random123 distribution.
TEST(Init, PhiloxKnownAnswers) {
  auto r = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r, (std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  r = philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff});
  EXPECT_EQ(r, (std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  r = philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0});
  EXPECT_EQ(r, (std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Init, NormalHasGpt2Statistics) {
  GptConfig c = *preset("tiny");
  ParamLayout lay = ParamLayout::gpt(c);
  for (const char* name : {"h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight"}) {
    const ParamSpec& spec = lay.find(name);
    std::vector<float> v(static_cast<std::size_t>(spec.numel()));
    init_values(c, spec, 7, 0, v);
    double m = 0, s = 0;
    for (float x : v) m += x;
    m /= static_cast<double>(v.size());
    for (float x : v) s += (x - m) * (x - m);
    s = std::sqrt(s / static_cast<double>(v.size()));
    const double want = spec.init == Init::kNormalScaled ? 0.02 / std::sqrt(2.0 * c.L) : 0.02;
    EXPECT_NEAR(m, 0.0, 3 * want / std::sqrt(static_cast<double>(v.size()))) << name;
    EXPECT_NEAR(s, want, 0.02 * want) << name;
  }
}

// A shard that initialises only its slice gets the single-rank values.
TEST(Init, AnySliceEqualsTheSliceOfTheWhole) {
  GptConfig c = *preset("tiny");
  ParamLayout lay = ParamLayout::gpt(c);
  const ParamSpec& qkv = lay.find("h.2.attn.c_attn.weight");  // (3C, C)
  std::vector<float> whole(static_cast<std::size_t>(qkv.numel()));
  init_values(c, qkv, 99, 0, whole);
  // The k rows of heads 1..2 (what a tensor shard would own), alone.
  const std::int64_t C = c.C, HS = c.HS();
  const std::int64_t first = (C + 1 * HS) * C;
  std::vector<float> slice(static_cast<std::size_t>(2 * HS * C));
  init_values(c, qkv, 99, first, slice);
  for (std::size_t i = 0; i < slice.size(); i++) ASSERT_EQ(slice[i], whole[first + i]) << i;
}

TEST(Init, IndependentOfVocabularyPadding) {
  GptConfig a = *preset("tiny"), b = a;
  a.V = b.V = 500;
  a.vocab_multiple = 1;    // Vp = 500
  b.vocab_multiple = 128;  // Vp = 512
  const ParamLayout la = ParamLayout::gpt(a), lb = ParamLayout::gpt(b);
  const ParamSpec& wa = la.find("wte.weight");
  const ParamSpec& wb = lb.find("wte.weight");
  std::vector<float> va(static_cast<std::size_t>(wa.numel())),
      vb(static_cast<std::size_t>(wb.numel()));
  init_values(a, wa, 5, 0, va);
  init_values(b, wb, 5, 0, vb);
  for (std::size_t i = 0; i < va.size(); i++) ASSERT_EQ(va[i], vb[i]);
  for (std::size_t i = va.size(); i < vb.size(); i++) ASSERT_EQ(vb[i], 0.0f);  // padding rows
}

TEST(Init, DifferentNamesAndSeedsDiffer) {
  EXPECT_NE(param_key(1, "h.0.mlp.c_fc.weight"), param_key(1, "h.1.mlp.c_fc.weight"));
  EXPECT_NE(param_key(1, "wte.weight"), param_key(2, "wte.weight"));
  EXPECT_NE(counter_normal(param_key(1, "a"), 0), counter_normal(param_key(1, "a"), 1));
}

TEST(Layout, IsLayerMajorAndAligned) {
  GptConfig c = *preset("tiny");
  ParamLayout lay = ParamLayout::gpt(c);
  std::int64_t prev_end = 0, numel = 0;
  int prev_layer = -1;
  for (const ParamSpec& s : lay.specs()) {
    EXPECT_EQ(s.offset % 16, 0) << s.name;
    EXPECT_GE(s.offset, prev_end) << s.name << " overlaps the parameter before it";
    if (s.layer >= 0) {
      EXPECT_GE(s.layer, prev_layer);
      prev_layer = s.layer;
    }
    prev_end = s.offset + s.numel();
    numel += s.numel();
  }
  EXPECT_LE(prev_end, lay.total());
  // By hand: wte 512*64 + wpe 64*64 + 4 layers of (2 LayerNorms 2*128,
  // c_attn 64*192+192, attn c_proj 64*64+64, c_fc 64*256+256, mlp c_proj
  // 256*64+64) + ln_f 128.
  EXPECT_EQ(numel, 32768 + 4096 + 4 * (256 + 12480 + 4160 + 16640 + 16448) + 128);
  EXPECT_EQ(lay.specs().front().name, "wte.weight");
  EXPECT_EQ(lay.specs().back().name, "ln_f.bias");
}

}  // namespace
}  // namespace troupe::model
