// ZeRO-1 partitions, gradient buckets and the pieces between shards and
// partitions: every element goes to exactly one owner, and comes back to
// every copy of it exactly once.
#include "actors/partition.h"

#include <gtest/gtest.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"

namespace troupe::comm {

// gtest prints a layout by this (found by argument-dependent lookup).
void PrintTo(const Layout& p, std::ostream* os) {
  *os << "pp=" << p.pp << " v=" << p.virtual_stages << " dp=" << p.dp << " tp=" << p.tp;
}

}  // namespace troupe::comm

namespace troupe::actors {

namespace {

model::GptConfig tiny8() {
  model::GptConfig c = *model::preset("tiny");
  c.L = 8;
  return c;
}

// The buckets follow one another from 0 to the end of the flat buffer.
void expect_buckets_tile(const model::ParamLayout& lay, const model::StageSpec& spec) {
  std::int64_t at = 0;
  for (const GradBucket& b : grad_buckets(lay, spec)) {
    EXPECT_EQ(b.range.begin, at);
    at = b.range.end;
  }
  EXPECT_EQ(at, lay.total());
}

// A rank's chunks are its stage's virtual stages (s, s + pp, ...), each
// laid out as its TP rank slices it; the pipeline's are every virtual stage.
TEST(Partition, ARanksChunksAreItsVirtualStagesAsItsTpRankSlicesThem) {
  const model::GptConfig c = tiny8();
  const comm::Layout p{.tp = 2, .pp = 2, .dp = 1, .virtual_stages = 2};
  const std::vector<Chunk> mine = rank_chunks(c, p, {.d = 0, .s = 1, .t = 1});
  ASSERT_EQ(mine.size(), 2u);
  for (int ch = 0; ch < 2; ch++) {
    const Chunk& k = mine[static_cast<std::size_t>(ch)];
    EXPECT_EQ(k.vs, 1 + 2 * ch);
    // Layers [2 vs, 2 vs + 2) of 8 over 4 chunks; the head on the last.
    EXPECT_EQ(k.spec.first_layer, 2 * k.vs);
    EXPECT_EQ(k.spec.last_layer, 2 * k.vs + 2);
    EXPECT_FALSE(k.spec.embedding);
    EXPECT_EQ(k.spec.head, k.vs == 3);
    const model::ParamSpec& qkv =
        k.params.find(absl::StrCat("h.", 2 * k.vs, ".attn.c_attn.weight"));
    EXPECT_EQ(qkv.slice.tp, 2);
    EXPECT_EQ(qkv.slice.t, 1);
    EXPECT_EQ(qkv.shape[0] * 2, qkv.full_shape[0]);
  }
  const std::vector<Chunk> all = pipeline_chunks(c, p);
  ASSERT_EQ(all.size(), 4u);
  for (int vs = 0; vs < 4; vs++) {
    EXPECT_EQ(all[static_cast<std::size_t>(vs)].vs, vs);
    EXPECT_EQ(all[static_cast<std::size_t>(vs)].spec.embedding, vs == 0);
  }
  // Every TP rank's layout has the same offsets and sizes.
  EXPECT_EQ(all[3].params.total(), mine[1].params.total());
}

TEST(Partition, BucketsTileTheLayoutAndWteIsAlone) {
  const model::GptConfig c = tiny8();
  for (int vs = 0; vs < 4; vs++) {
    const model::StageSpec spec = chunk_spec(c, {.pp = 2, .dp = 1, .virtual_stages = 2}, vs);
    const model::ParamLayout lay = model::ParamLayout::gpt(c, spec);
    expect_buckets_tile(lay, spec);
    if (spec.embedding || spec.head) {
      EXPECT_EQ(grad_buckets(lay, spec).front().range, wte_range(lay));
    }
  }
}

TEST(Partition, BucketsCoverTheAlignmentPadding) {
  model::GptConfig c = tiny8();
  c.C = 8;  // LayerNorm tensors of 8 floats: 8 floats of padding after each
  c.NH = 1;
  const model::StageSpec spec = chunk_spec(c, {.pp = 2, .dp = 1, .virtual_stages = 1}, 1);
  expect_buckets_tile(model::ParamLayout::gpt(c, spec), spec);
}

TEST(Partition, PartitionsSplitTheOwnedRegionEvenly) {
  const model::GptConfig c = tiny8();
  const comm::Layout p{.pp = 2, .dp = 3, .virtual_stages = 1};
  const model::StageSpec head = chunk_spec(c, p, 1);
  const model::ParamLayout lay = model::ParamLayout::gpt(c, head);
  EXPECT_EQ(owned_region(lay, head).begin, wte_range(lay).end);  // the tied copy is not owned
  std::int64_t at = owned_region(lay, head).begin;
  for (int d = 0; d < 3; d++) {
    const Range r = partition_range(lay, head, 3, d);
    EXPECT_EQ(r.begin, at);
    // Sizes floor(n/3) or floor(n/3) + 1 (one-sided before: a partition
    // smaller than a third passed).
    const std::int64_t third = owned_region(lay, head).size() / 3;
    EXPECT_GE(r.size(), third) << "partition " << d;
    EXPECT_LE(r.size(), third + 1) << "partition " << d;
    at = r.end;
  }
  EXPECT_EQ(at, lay.total());
}

// For each (layout), count where every gradient element goes and where
// every parameter element comes from.
class PiecesTest : public ::testing::TestWithParam<comm::Layout> {};

TEST_P(PiecesTest, EveryGradientOnceToItsOwnerEveryParameterOnceBack) {
  const model::GptConfig c = tiny8();
  const comm::Layout p = GetParam();
  // Gradients: per source chunk, each element sent to one partition (any
  // replica sends the same pieces).
  std::map<int, std::vector<int>> sent;  // vs -> count per element
  for (int vs = 0; vs < p.chunks(); vs++) {
    sent[vs].assign(
        static_cast<std::size_t>(model::ParamLayout::gpt(c, chunk_spec(c, p, vs)).total()), 0);
  }
  for (const GradPiece& g : grad_pieces(pipeline_chunks(c, p), p)) {
    const int vs = p.virtual_stage(g.src_stage, g.src_chunk);
    for (std::int64_t i = g.range.begin; i < g.range.end; i++)
      sent[vs][static_cast<std::size_t>(i)]++;
    // The receiving partition owns it.
    const int dvs = p.virtual_stage(g.dst_stage, g.dst_chunk);
    const model::StageSpec dspec = chunk_spec(c, p, dvs);
    const Range own = partition_range(model::ParamLayout::gpt(c, dspec), dspec, p.dp, g.dst_d);
    EXPECT_EQ(g.range.intersect(own), g.range);
    EXPECT_EQ(g.tied_wte, dvs != vs);
  }
  for (auto& [vs, counts] : sent) {
    for (int n : counts) ASSERT_EQ(n, 1) << "chunk " << vs;
  }
  // Parameters: every element of every chunk's buffer (the head's wte copy
  // included) is written exactly once.
  std::map<int, std::vector<int>> got;
  for (auto& [vs, counts] : sent) got[vs].assign(counts.size(), 0);
  for (const ParamPiece& q : param_pieces(pipeline_chunks(c, p), p)) {
    const int vs = p.virtual_stage(q.dst_stage, q.dst_chunk);
    for (std::int64_t i = q.range.begin; i < q.range.end; i++)
      got[vs][static_cast<std::size_t>(i)]++;
  }
  for (auto& [vs, counts] : got) {
    for (int n : counts) ASSERT_EQ(n, 1) << "chunk " << vs;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PiecesTest,
                         ::testing::Values(comm::Layout{.pp = 1, .dp = 1, .virtual_stages = 1},
                                           comm::Layout{.pp = 1, .dp = 4, .virtual_stages = 1},
                                           comm::Layout{.pp = 2, .dp = 3, .virtual_stages = 1},
                                           comm::Layout{.pp = 4, .dp = 2, .virtual_stages = 1},
                                           comm::Layout{.pp = 2, .dp = 2, .virtual_stages = 2},
                                           comm::Layout{.pp = 1, .dp = 4, .virtual_stages = 2},
                                           comm::Layout{.pp = 4, .dp = 1, .virtual_stages = 2},
                                           comm::Layout{.pp = 2, .dp = 7, .virtual_stages = 1}));

TEST(Partition, ShapesBeyondTheTagFieldsAreClearErrors) {
  const model::GptConfig c = tiny8();
  // A pipeline message's micro-batch has 20 bits (comm/tag.h).
  EXPECT_TRUE(check_pipeline_shape(c, {.pp = 2, .dp = 2, .virtual_stages = 1}, 257).ok());
  EXPECT_TRUE(check_pipeline_shape(c, {.pp = 2, .dp = 2, .virtual_stages = 1}, 1 << 20).ok());
  absl::Status st = check_pipeline_shape(c, {.pp = 2, .dp = 2, .virtual_stages = 1}, (1 << 20) + 1);
  EXPECT_EQ(st.message(),
            "1048577 micro-batches per replica and step: at most 1048576 (raise "
            "--micro-batch-size)");
  st = check_pipeline_shape(c, {.pp = 1, .dp = 1, .virtual_stages = 17}, 4);
  EXPECT_NE(st.message().find("--virtual-stages 17"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace troupe::actors
