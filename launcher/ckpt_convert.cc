// `troupe ckpt convert`: a checkpoint resharded into another layout.
#include "launcher/ckpt_convert.h"

#include <deque>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace troupe::launcher {
namespace {
namespace ckpt = model::ckpt;

// One rank of the new layout: its chunks' layouts and buffers (host memory).
struct NewRank {
  std::deque<model::ParamLayout> layouts;  // stable addresses: pieces point here
  std::deque<std::vector<float>> buffers;
  std::vector<actors::CheckpointChunk> chunks;
};

float* buffer(NewRank& r, std::int64_t n, bool wanted) {
  if (!wanted) return nullptr;
  r.buffers.emplace_back(static_cast<std::size_t>(n), 0.0f);
  return r.buffers.back().data();
}

// Rank `rank` of `par` (config already sliced), filled from `c` as RankUnit's
// load fills it, then written into `tmp`.
absl::StatusOr<std::vector<ckpt::TensorRecord>> convert_rank(const ckpt::Checkpoint& c,
                                                             const model::GptConfig& config,
                                                             const actors::ParallelOptions& par,
                                                             int rank, const std::string& tmp) {
  const comm::Coord coord = par.layout().coord(rank);
  NewRank r;
  for (actors::Chunk& chunk : actors::rank_chunks(config, par, coord)) {
    const model::StageSpec spec = chunk.spec;
    r.layouts.push_back(std::move(chunk.params));
    const model::ParamLayout& lay = r.layouts.back();
    const std::int64_t part = actors::partition_range(lay, spec, par.dp, coord.d).size();
    r.chunks.push_back({.layout = &lay,
                        .spec = spec,
                        .params = buffer(r, lay.total(), coord.d == 0),
                        .master = buffer(r, part, c.has(ckpt::Kind::kMaster)),
                        .adam_m = buffer(r, part, c.has(ckpt::Kind::kAdamM)),
                        .adam_v = buffer(r, part, c.has(ckpt::Kind::kAdamV))});
  }
  const std::vector<ckpt::Piece> pieces = actors::checkpoint_pieces(r.chunks, coord, par.dp);
  for (const ckpt::Piece& p : pieces) {
    if (absl::Status st = c.fill(p); !st.ok()) return st;
  }
  return ckpt::write_rank_file(tmp, rank, pieces);
}

}  // namespace

absl::Status convert_checkpoint(const ckpt::Checkpoint& c, const std::string& to,
                                const actors::ParallelOptions& par) {
  ckpt::Meta meta = c.meta();
  // The manifest holds the model as the writer's ranks did: its vocabulary
  // padded to a multiple of vocab_multiple x tp. The new layout pads for
  // its own tp.
  model::TrainOptions options = meta.options;
  if (meta.tp < 1 || options.model.vocab_multiple % meta.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(c.dir(), ": the manifest's vocab_multiple ",
                                                   options.model.vocab_multiple,
                                                   " is not a multiple of its tp ", meta.tp));
  }
  options.model.vocab_multiple /= meta.tp;
  if (absl::Status st = par.validate(options); !st.ok()) return st;
  options.model = par.sliced_config(options.model);
  std::error_code ec;
  const std::string final_dir = absl::StrCat(to, "/", ckpt::iter_name(meta.step));
  if (std::filesystem::exists(final_dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("--to ", to, ": ", final_dir, " exists (not overwritten)"));
  }
  // Every checksum first: a damaged checkpoint leaves --to untouched (not
  // even made).
  if (absl::Status st = c.verify(); !st.ok()) return st;
  absl::StatusOr<std::string> tmp = ckpt::begin_save(to, meta.step);
  if (!tmp.ok()) return tmp.status();
  std::vector<ckpt::TensorRecord> records;
  for (int rank = 0; rank < par.world(); rank++) {
    absl::StatusOr<std::vector<ckpt::TensorRecord>> r =
        convert_rank(c, options.model, par, rank, *tmp);
    if (!r.ok()) {
      std::filesystem::remove_all(*tmp, ec);
      return r.status();
    }
    records.insert(records.end(), r->begin(), r->end());
  }
  meta.options = options;
  meta.tp = par.tp;
  meta.pp = par.pp;
  meta.dp = par.dp;
  meta.virtual_stages = par.virtual_stages;
  meta.schedule = actors::schedule_name(par.schedule);
  meta.writer = ckpt::writer_name();
  return ckpt::commit(to, *tmp, meta, records, /*keep_last=*/0);
}

}  // namespace troupe::launcher
