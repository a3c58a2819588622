// ZeRO-1 partition ranges, gradient buckets and the pieces between shards
// and optimizer partitions.
#include "actors/partition.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"

namespace troupe::actors {

using model::GradPoint;

Range Range::intersect(Range o) const {
  Range r{std::max(begin, o.begin), std::min(end, o.end)};
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

model::StageSpec chunk_spec(const model::GptConfig& config, const comm::Layout& p, int vs) {
  const int per = config.L / p.chunks();
  return {vs * per, (vs + 1) * per, vs == 0, vs == p.chunks() - 1};
}

std::vector<Chunk> pipeline_chunks(const model::GptConfig& config, const comm::Layout& p, int t) {
  std::vector<Chunk> out;
  for (int vs = 0; vs < p.chunks(); vs++) {
    const model::StageSpec spec = chunk_spec(config, p, vs);
    out.push_back({vs, spec, model::ParamLayout::gpt(config, spec, {p.tp, t})});
  }
  return out;
}

std::vector<Chunk> rank_chunks(const model::GptConfig& config, const comm::Layout& p,
                               const comm::Coord& at) {
  std::vector<Chunk> out;
  for (int c = 0; c < p.virtual_stages; c++) {
    const int vs = p.virtual_stage(at.s, c);
    const model::StageSpec spec = chunk_spec(config, p, vs);
    out.push_back({vs, spec, model::ParamLayout::gpt(config, spec, {p.tp, at.t})});
  }
  return out;
}

Range wte_range(const model::ParamLayout& layout) {
  const model::ParamSpec& w = layout.find("wte.weight");
  return {w.offset, w.offset + w.numel()};
}

Range owned_region(const model::ParamLayout& layout, const model::StageSpec& spec) {
  Range all{0, layout.total()};
  if (wte_elsewhere(spec)) all.begin = wte_range(layout).end;
  return all;
}

Range partition_range(const model::ParamLayout& layout, const model::StageSpec& spec, int dp,
                      int d) {
  const Range own = owned_region(layout, spec);
  auto [b, e] = comm::chunk_range(static_cast<std::size_t>(own.size()), dp, d);
  return {own.begin + static_cast<std::int64_t>(b), own.begin + static_cast<std::int64_t>(e)};
}

namespace {

GradPoint ready_point(const model::ParamSpec& p, const model::StageSpec& spec) {
  if (p.layer >= 0) return {GradPoint::Part::kLayer, p.layer};
  if (p.name == "wpe.weight") return {GradPoint::Part::kEmbedding, -1};
  if (p.name == "wte.weight") {
    // The embedding's backward is the last to add to wte.
    return {spec.embedding ? GradPoint::Part::kEmbedding : GradPoint::Part::kHead, -1};
  }
  return {GradPoint::Part::kHead, -1};  // ln_f
}

}  // namespace

std::vector<GradBucket> grad_buckets(const model::ParamLayout& layout,
                                     const model::StageSpec& spec) {
  std::vector<GradBucket> out;
  bool last_was_wte = false;
  const std::vector<model::ParamSpec>& specs = layout.specs();
  for (std::size_t i = 0; i < specs.size(); i++) {
    const model::ParamSpec& p = specs[i];
    // With the alignment padding after it, so that buckets tile the buffer
    // (the padding's zeros travel too; no receive buffer is left unwritten).
    const std::int64_t end = i + 1 < specs.size() ? specs[i + 1].offset : layout.total();
    const GradPoint ready = ready_point(p, spec);
    const bool is_wte = p.name == "wte.weight";  // its own bucket: it may go elsewhere
    if (!out.empty() && out.back().ready == ready && !is_wte && !last_was_wte) {
      out.back().range.end = end;
    } else {
      out.push_back({{p.offset, end}, ready});
    }
    last_was_wte = is_wte;
  }
  return out;
}

std::vector<GradPiece> grad_pieces(const std::vector<Chunk>& pipeline, const comm::Layout& p) {
  std::vector<GradPiece> out;
  const model::StageSpec& emb_spec = pipeline.front().spec;
  const model::ParamLayout& emb_layout = pipeline.front().params;
  for (const Chunk& chunk : pipeline) {
    const int vs = chunk.vs;
    const model::StageSpec& spec = chunk.spec;
    const model::ParamLayout& layout = chunk.params;
    const std::vector<GradBucket> buckets = grad_buckets(layout, spec);
    const Range wte = wte_elsewhere(spec) ? wte_range(layout) : Range{};
    for (int b = 0; b < static_cast<int>(buckets.size()); b++) {
      const Range r = buckets[static_cast<std::size_t>(b)].range;
      const bool tied = !r.intersect(wte).empty();
      for (int d = 0; d < p.dp; d++) {
        const Range part = tied ? partition_range(emb_layout, emb_spec, p.dp, d)
                                : partition_range(layout, spec, p.dp, d);
        const Range piece = r.intersect(part);
        if (piece.empty()) continue;
        out.push_back({.src_stage = p.stage_of(vs),
                       .src_chunk = p.chunk_of(vs),
                       .bucket = b,
                       .dst_stage = tied ? 0 : p.stage_of(vs),
                       .dst_chunk = tied ? 0 : p.chunk_of(vs),
                       .dst_d = d,
                       .range = piece,
                       .tied_wte = tied});
      }
    }
  }
  return out;
}

std::vector<ParamPiece> param_pieces(const std::vector<Chunk>& pipeline, const comm::Layout& p) {
  std::vector<ParamPiece> out;
  const int head_vs = p.chunks() - 1;
  for (const Chunk& chunk : pipeline) {
    const int vs = chunk.vs;
    const model::StageSpec& spec = chunk.spec;
    const model::ParamLayout& layout = chunk.params;
    const int s = p.stage_of(vs), c = p.chunk_of(vs);
    for (int d = 0; d < p.dp; d++) {
      const Range part = partition_range(layout, spec, p.dp, d);
      if (!part.empty()) {
        out.push_back({.stage = s,
                       .src_chunk = c,
                       .src_d = d,
                       .dst_stage = s,
                       .dst_chunk = c,
                       .range = part,
                       .tied_wte = false});
      }
      if (spec.embedding && head_vs != vs) {
        const Range tied = part.intersect(wte_range(layout));
        if (tied.empty()) continue;
        out.push_back({.stage = s,
                       .src_chunk = c,
                       .src_d = d,
                       .dst_stage = p.stage_of(head_vs),
                       .dst_chunk = p.chunk_of(head_vs),
                       .range = tied,
                       .tied_wte = true});
      }
    }
  }
  return out;
}

absl::Status check_pipeline_shape(const model::GptConfig& config, const comm::Layout& p, int m) {
  if (p.pp < 1 || p.dp < 1 || p.virtual_stages < 1 || p.tp < 1) {
    return absl::InvalidArgumentError("--tp, --pp, --dp and --virtual-stages must be positive");
  }
  if (config.NH % p.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heads ", config.NH, " does not divide among --tp ", p.tp, " tensor-parallel ranks"));
  }
  if (p.virtual_stages > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual-stages ", p.virtual_stages, ": at most 16 model chunks per stage"));
  }
  if (p.tp * p.pp * p.dp > 32768) {
    return absl::InvalidArgumentError("--tp x --pp x --dp: at most 32768 ranks");
  }
  if (static_cast<std::uint32_t>(m) > comm::kMaxMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat(m, " micro-batches per replica and step: at most ", comm::kMaxMicroBatches,
                     " (raise --micro-batch-size)"));
  }
  if (config.L % p.chunks() == 0 && config.L / p.chunks() + 3 > 4096) {
    return absl::InvalidArgumentError("more than 4093 layers in one model chunk");
  }
  return absl::OkStatus();
}

}  // namespace troupe::actors
