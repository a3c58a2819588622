// Where a model's parameters live across pipeline stages, model chunks and
// ZeRO-1 optimizer partitions, and the pieces of gradients and parameters
// that travel between shard actors and optimizer partitions.
//
// Virtual stage vs = c*pp + s is model chunk c of stage s (c = 0 unless the
// schedule is interleaved; in zbv's V chunk 1 is vs = 2pp-1-s:
// comm::Layout::virtual_stage); it holds L/(pp*v) consecutive layers, the
// embeddings when vs = 0, the final LayerNorm and LM head when vs is last.
//
// Partition d of a chunk (on the rank of replica d) owns one contiguous range
// of the chunk's flat buffer: chunk_range of the chunk's owned region over dp.
// The LM head is tied to the token embedding: a chunk with the head but not
// the embedding owns none of its wte copy; its wte gradient goes to the
// embedding chunk's partitions, which sum both shares, step once and send the
// new wte to both copies. wte is first in every layout that has it, so its
// offsets are the same in both chunks.
//
//   const comm::Layout p{.pp = 2, .dp = 4};
//   std::vector<GradPiece> pieces = grad_pieces(pipeline_chunks(config, p), p);
//   for (const GradPiece& p : pieces) if (p.src_stage == s) { ... send p.range to p.dst_d ... }
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "comm/groups.h"
#include "model/config.h"
#include "model/gpt.h"
#include "model/layout.h"

namespace troupe::actors {

struct Range {
  std::int64_t begin = 0, end = 0;  // elements, [begin, end)
  std::int64_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return size() == 0; }
  Range intersect(Range o) const;
  bool operator==(const Range&) const = default;
};

// A pipeline's chunks, stages and virtual stages are the layout's
// (comm::Layout: chunks(), stage_of, chunk_of, virtual_stage).

// The part of the model that virtual stage vs holds (L must split evenly).
model::StageSpec chunk_spec(const model::GptConfig& config, const comm::Layout& p, int vs);

// A model chunk as the pipeline places it: its virtual stage, what it
// holds, and its flat buffer's parameter layout as TP rank t slices it (the
// offsets and sizes are every TP rank's). Built once where a run, a memory
// plan, a weights gather or a checkpoint conversion begins, and passed to
// what needs it. (`config`: the model as the ranks hold it, sliced_config.)
struct Chunk {
  int vs = 0;
  model::StageSpec spec;
  model::ParamLayout params;
};
// Every chunk of the pipeline, by virtual stage, as TP rank t holds it.
std::vector<Chunk> pipeline_chunks(const model::GptConfig& config, const comm::Layout& p,
                                   int t = 0);
// The chunks of the rank at `at` (stage at.s, TP rank at.t): chunk c at index c.
std::vector<Chunk> rank_chunks(const model::GptConfig& config, const comm::Layout& p,
                               const comm::Coord& at);

// True when this chunk's wte is a copy whose optimizer state lives with the
// embedding chunk.
inline bool wte_elsewhere(const model::StageSpec& spec) { return spec.head && !spec.embedding; }

// The range of a chunk's flat buffer its partitions own (all of it but a
// tied wte copy), and partition d's part of it.
Range owned_region(const model::ParamLayout& layout, const model::StageSpec& spec);
Range partition_range(const model::ParamLayout& layout, const model::StageSpec& spec, int dp,
                      int d);
// [0, Vp*C): wte's elements (the layout must hold wte).
Range wte_range(const model::ParamLayout& layout);

// Gradients that become final together in the backward (the last
// micro-batch's): a contiguous range of the flat buffer and the point of
// the backward after which it is final. In layout order.
struct GradBucket {
  Range range;
  model::GradPoint ready;
};
std::vector<GradBucket> grad_buckets(const model::ParamLayout& layout,
                                     const model::StageSpec& spec);

// One gradient message of any replica d: bucket `bucket` of chunk
// (src_stage, src_chunk), the part `range` that partition dst_d of chunk
// (dst_stage, dst_chunk) owns.
struct GradPiece {
  int src_stage = 0, src_chunk = 0, bucket = 0;
  int dst_stage = 0, dst_chunk = 0, dst_d = 0;
  Range range;
  bool tied_wte = false;  // the head chunk's wte share, to the embedding chunk
};
// One parameter message to any replica d: partition src_d of chunk
// (stage, src_chunk) sends `range` to that replica's chunk (stage', dst_chunk).
struct ParamPiece {
  int stage = 0, src_chunk = 0, src_d = 0;
  int dst_stage = 0, dst_chunk = 0;
  Range range;
  bool tied_wte = false;  // the new wte, to the head chunk's copy
};

// Every piece of the pipeline (`pipeline`: pipeline_chunks's, every virtual
// stage in order from 0, not a rank's chunks).
std::vector<GradPiece> grad_pieces(const std::vector<Chunk>& pipeline, const comm::Layout& p);
std::vector<ParamPiece> param_pieces(const std::vector<Chunk>& pipeline, const comm::Layout& p);

// The layout fits the tags (comm/tag.h): chunks, buckets and micro-batches
// within their fields. InvalidArgument naming the flag otherwise.
absl::Status check_pipeline_shape(const model::GptConfig& config, const comm::Layout& p, int m);

}  // namespace troupe::actors
