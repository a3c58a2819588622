// Reading a checkpoint: the manifest, the rank files, and a parameter's
// global tensor assembled from its pieces.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "model/checkpoint.h"
#include "model/checkpoint_json.h"

namespace troupe::model::ckpt {
namespace fs = std::filesystem;

struct Checkpoint::Cache {
  std::mutex mu;                                 // (ranks of one process may share one)
  std::map<std::string, SafetensorsFile> files;  // by file name, headers only
  std::string key;                               // "<kind>/<param>" of `tensor`
  std::vector<float> tensor;
  std::vector<std::int64_t> shape;
};

namespace {

absl::StatusOr<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The slice as a ParamSpec, to map its elements with global_index().
ParamSpec slice_spec(const TensorRecord& r) {
  ParamSpec s;
  s.name = r.param;
  s.shape.assign(r.slice_shape.begin(), r.slice_shape.end());
  s.full_shape.assign(r.global_shape.begin(), r.global_shape.end());
  s.split = r.split;
  s.slice = {r.tp, r.t};
  return s;
}

}  // namespace

absl::StatusOr<Checkpoint> Checkpoint::open(const std::string& path) {
  std::error_code ec;
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!fs::exists(dir, ec)) return absl::NotFoundError(absl::StrCat(path, ": does not exist"));
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a checkpoint directory"));
  }
  if (!fs::exists(absl::StrCat(dir, "/manifest.json"), ec)) {
    const std::string tracker = absl::StrCat(dir, "/", kTracker);
    absl::StatusOr<std::string> text = read_text(tracker);
    if (!text.ok()) {
      return absl::NotFoundError(absl::StrCat(path, ": not a checkpoint (no manifest.json) and no ",
                                              kTracker, " naming one"));
    }
    int step = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &step) || step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(tracker, ": not an iteration number: \"", absl::CHexEscape(*text), "\""));
    }
    dir = absl::StrCat(dir, "/", iter_name(step));
    if (!fs::exists(absl::StrCat(dir, "/manifest.json"), ec)) {
      return absl::NotFoundError(absl::StrCat(tracker, " names iteration ", step, " but ", dir,
                                              " is not a complete checkpoint"));
    }
  }
  Checkpoint c;
  c.dir_ = dir;
  c.cache_ = std::make_shared<Cache>();
  const std::string manifest = absl::StrCat(dir, "/manifest.json");
  absl::StatusOr<std::string> text = read_text(manifest);
  if (!text.ok()) return text.status();
  if (absl::Status st = parse_manifest(*text, manifest, &c.meta_, &c.records_); !st.ok()) {
    return st;
  }
  // Records may name only this checkpoint's rank files; every one exists
  // (its header is read when it is first needed: a rank reads its own
  // pieces, not every rank's file).
  std::map<std::string, int> ranks;
  for (int r = 0; r < c.meta_.world(); r++) ranks[rank_file_name(r)] = r;
  for (std::size_t i = 0; i < c.records_.size(); i++) {
    const TensorRecord& r = c.records_[i];
    if (ranks.count(r.file) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(manifest, ": tensor ", r.name, " names \"",
                                                     r.file, "\", not one of its ", ranks.size(),
                                                     " rank files"));
    }
    c.by_tensor_[absl::StrCat(kind_name(r.kind), "/", r.param)].push_back(i);
  }
  for (const auto& [name, r] : ranks) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (!fs::is_regular_file(path, ec)) {
      return absl::NotFoundError(absl::StrCat(path, fs::exists(path, ec)
                                                        ? ": not a regular file (a rank's file)"
                                                        : ": missing (a rank's file)"));
    }
  }
  // Every element of every tensor is in some piece, and the pieces agree on
  // its global shape: checked before anything is read or allocated, so a
  // damaged manifest cannot make a reader allocate what no file holds.
  for (const auto& [key, idx] : c.by_tensor_) {
    const std::vector<std::int64_t>& g = c.records_[idx.front()].global_shape;
    std::int64_t numel = 1, covered = 0;
    for (std::int64_t d : g) numel *= d;
    for (std::size_t i : idx) {
      const TensorRecord& r = c.records_[i];
      if (r.global_shape != g) {
        return absl::InvalidArgumentError(
            absl::StrCat(manifest, ": the pieces of ", key, " disagree on its global shape"));
      }
      if (r.split != Split::kNone || r.t == 0) covered += r.end - r.begin;
    }
    if (covered < numel) {
      return absl::DataLossError(absl::StrCat(manifest, ": ", numel - covered, " of ", numel,
                                              " elements of ", key, " are in no rank's file"));
    }
  }
  return c;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::file(const std::string& name) const {
  auto it = cache_->files.find(name);
  if (it != cache_->files.end()) return &it->second;
  if (name.find('/') != std::string::npos || name.empty() || name[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat(dir_, ": a record names the file \"", name, "\", which is not a rank file"));
  }
  absl::StatusOr<SafetensorsFile> f =
      SafetensorsFile::open(absl::StrCat(dir_, "/", name), SafetensorsFile::Read::kHeader);
  if (!f.ok()) {
    if (absl::IsNotFound(f.status())) {
      return absl::NotFoundError(absl::StrCat(dir_, "/", name, ": missing (a rank's file)"));
    }
    return f.status();
  }
  // It says it is that rank's, and holds every tensor the manifest says.
  const std::string path = absl::StrCat(dir_, "/", name);
  int rank = -1;
  for (int r = 0; r < meta_.world() && rank < 0; r++) {
    if (rank_file_name(r) == name) rank = r;
  }
  auto it_rank = f->metadata().find("rank");
  if (rank < 0 || it_rank == f->metadata().end() || it_rank->second != std::to_string(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not rank ", rank, "'s checkpoint file"));
  }
  for (const TensorRecord& r : records_) {
    if (r.file != name) continue;
    const SafetensorsEntry* e = f->find(r.name);
    const std::uint64_t want = static_cast<std::uint64_t>(r.end - r.begin) * 4;
    if (e == nullptr || e->dtype != "F32" || e->end - e->begin != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", r.name,
          e == nullptr ? " is missing" : " has another dtype or size than the manifest says"));
    }
  }
  return &cache_->files.emplace(name, std::move(*f)).first->second;
}

absl::Status Checkpoint::check_model(const GptConfig& c) const {
  const GptConfig& k = meta_.options.model;
  std::vector<std::string> diffs;
  auto cmp = [&](const char* flag, int here, int there) {
    if (here != there)
      diffs.push_back(absl::StrCat(flag, " ", here, " here, ", there, " in the checkpoint"));
  };
  cmp("--layers", c.L, k.L);
  cmp("--channels", c.C, k.C);
  cmp("--heads", c.NH, k.NH);
  cmp("--seq-len", c.T, k.T);
  cmp("--vocab-size", c.V, k.V);
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(dir_, " holds another model: ", absl::StrJoin(diffs, "; ")));
}

absl::Status Checkpoint::check_resume(const TrainOptions& o) const {
  const TrainOptions& k = meta_.options;
  std::vector<std::string> diffs;
  if (o.global_batch != k.global_batch) {
    diffs.push_back(absl::StrCat("--global-batch-size ", o.global_batch, " here, ", k.global_batch,
                                 " in the checkpoint"));
  }
  if (o.data_path != k.data_path) {
    diffs.push_back(absl::StrCat("--data-path \"", absl::StrJoin(o.data_path, " "), "\" here, \"",
                                 absl::StrJoin(k.data_path, " "), "\" in the checkpoint"));
  }
  if (o.split != k.split) {
    diffs.push_back(absl::StrCat("--split ", o.split, " here, ", k.split, " in the checkpoint"));
  }
  if (o.shuffle != k.shuffle) diffs.push_back("--no-shuffle differs");
  if (o.seed != k.seed) {
    diffs.push_back(absl::StrCat("--seed ", o.seed, " here, ", k.seed, " in the checkpoint"));
  }
  // The optimizer's settings and the LR schedule (as Megatron's scheduler
  // checks them): a resume continues the run, it does not change it.
  auto cmp = [&](const char* flag, double here, double there) {
    if (here != there) {
      diffs.push_back(absl::StrCat(flag, " ", here, " here, ", there, " in the checkpoint"));
    }
  };
  cmp("--lr", o.lr.lr, k.lr.lr);
  cmp("--min-lr", o.lr.min_lr, k.lr.min_lr);
  cmp("--lr-warmup-iters", o.lr.warmup_iters, k.lr.warmup_iters);
  cmp("--lr-decay-iters (default: --steps)", o.lr.decay_iters, k.lr.decay_iters);
  cmp("--lr-warmup-samples", static_cast<double>(o.lr.warmup_samples),
      static_cast<double>(k.lr.warmup_samples));
  cmp("--lr-decay-samples (default: --train-samples)", static_cast<double>(o.lr.decay_samples),
      static_cast<double>(k.lr.decay_samples));
  if (o.rampup.start != k.rampup.start || o.rampup.increment != k.rampup.increment ||
      o.rampup.samples != k.rampup.samples) {
    auto ramp = [](const RampUp& r) {
      return r.enabled() ? absl::StrCat(r.start, " ", r.increment, " ", r.samples)
                         : std::string("none");
    };
    diffs.push_back(absl::StrCat("--rampup-batch-size ", ramp(o.rampup), " here, ", ramp(k.rampup),
                                 " in the checkpoint (the data order follows it)"));
  }
  cmp("--adam-beta1", o.adam.beta1, k.adam.beta1);
  cmp("--adam-beta2", o.adam.beta2, k.adam.beta2);
  cmp("--adam-eps", o.adam.eps, k.adam.eps);
  cmp("--weight-decay", o.adam.weight_decay, k.adam.weight_decay);
  cmp("--clip-grad", o.clip_grad, k.clip_grad);
  if (o.activations.precision != k.activations.precision) {
    diffs.push_back(absl::StrCat(
        "the precision ", gpu::precision_name(o.activations.precision), " here (--bf16, --fp16), ",
        gpu::precision_name(k.activations.precision), " in the checkpoint"));
  }
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      dir_,
      " was written by a run with other data or optimizer settings, so resuming would "
      "not continue it: ",
      absl::StrJoin(diffs, "; "), " (--no-load-optim starts a new run from its parameters)"));
}

bool Checkpoint::has(Kind kind) const {
  return std::any_of(records_.begin(), records_.end(),
                     [kind](const TensorRecord& r) { return r.kind == kind; });
}

absl::Status Checkpoint::read_piece(const TensorRecord& r, std::vector<char>* bytes) const {
  absl::StatusOr<const SafetensorsFile*> f = file(r.file);
  if (!f.ok()) return f.status();
  if (absl::Status st = (*f)->read(*(*f)->find(r.name), bytes); !st.ok()) return st;
  if (crc_of(bytes->data(), bytes->size()) != r.crc32) {
    return absl::DataLossError(
        absl::StrCat(dir_, "/", r.file, ": tensor ", r.name,
                     " is damaged (its CRC-32 differs from the manifest's)"));
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::verify() const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  std::vector<char> bytes;
  for (const TensorRecord& r : records_) {
    if (absl::Status st = read_piece(r, &bytes); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Checkpoint::global_tensor(
    Kind kind, const std::string& param, std::vector<std::int64_t>* shape) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  absl::StatusOr<const std::vector<float>*> t = assemble(kind, param, shape);
  if (!t.ok()) return t.status();
  return **t;
}

absl::StatusOr<const std::vector<float>*> Checkpoint::assemble(
    Kind kind, const std::string& param, std::vector<std::int64_t>* shape) const {
  const std::string key = absl::StrCat(kind_name(kind), "/", param);
  Cache& cache = *cache_;
  if (cache.key == key) {
    *shape = cache.shape;
    return &cache.tensor;
  }
  cache.key.clear();
  auto it = by_tensor_.find(key);
  if (it == by_tensor_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no ", kind_name(kind), " of ", param));
  }
  const std::vector<std::int64_t>& gshape = records_[it->second.front()].global_shape;
  std::int64_t n = 1;
  for (std::int64_t d : gshape) n *= d;
  // The files first: their headers hold the pieces' bytes, so what is
  // allocated below is no more than the files hold (open() has checked
  // that the pieces cover the tensor).
  for (std::size_t i : it->second) {
    if (absl::StatusOr<const SafetensorsFile*> f = file(records_[i].file); !f.ok())
      return f.status();
  }
  std::vector<float> out(static_cast<std::size_t>(n), 0.0f);
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  std::vector<char> bytes;
  for (std::size_t i : it->second) {
    const TensorRecord& r = records_[i];
    if (r.global_shape != gshape) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": ", key, " has pieces of different global shapes"));
    }
    // A replicated parameter is on every TP rank (the same values): t = 0's.
    if (r.split == Split::kNone && r.t != 0) continue;
    if (absl::Status st = read_piece(r, &bytes); !st.ok()) return st;
    const float* src = reinterpret_cast<const float*>(bytes.data());
    const ParamSpec spec = slice_spec(r);
    for (std::int64_t e = r.begin; e < r.end; e++) {
      const std::size_t g = static_cast<std::size_t>(spec.global_index(e));
      out[g] = src[e - r.begin];
      seen[g] = true;
    }
  }
  const std::int64_t missing = std::count(seen.begin(), seen.end(), false);
  if (missing > 0) {
    return absl::DataLossError(absl::StrCat(dir_, ": ", missing, " of ", n, " elements of ", key,
                                            " are in no rank's file"));
  }
  cache.key = key;
  cache.tensor = std::move(out);
  cache.shape = gshape;
  *shape = gshape;
  return &cache.tensor;
}

namespace {

// Whether the record can hold an element of `spec`'s local range [lb, le):
// the same slicing and another TP slice, or a disjoint range of the same
// slice, cannot (a resume in its own layout reads only its own pieces).
bool may_overlap(const TensorRecord& r, const ParamSpec& spec, std::int64_t lb, std::int64_t le) {
  const Split split = spec.replicated() ? Split::kNone : spec.split;
  if (r.split != split || r.tp != (split == Split::kNone ? r.tp : spec.slice.tp)) return true;
  if (!std::equal(r.slice_shape.begin(), r.slice_shape.end(), spec.shape.begin(),
                  spec.shape.end())) {
    return true;  // (another vocabulary padding: other rows in each slice)
  }
  if (split != Split::kNone && r.t != spec.slice.t) return false;
  return r.begin < le && lb < r.end;
}

}  // namespace

absl::Status Checkpoint::fill(const Piece& p) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  std::vector<char> bytes;
  for (const ParamSpec& spec : p.layout->specs()) {
    const std::int64_t b = std::max(p.begin, spec.offset);
    const std::int64_t e = std::min(p.end, spec.offset + spec.numel());
    if (b >= e) continue;
    const std::string key = absl::StrCat(kind_name(p.kind), "/", spec.name);
    auto it = by_tensor_.find(key);
    if (it == by_tensor_.end()) {
      return absl::NotFoundError(absl::StrCat(dir_, ": no ", key, " (of this model's tensors)"));
    }
    // The same tensor here and there, but for the vocabulary's padding rows
    // (zero in every layout, as the loss never reaches them).
    const std::vector<std::int64_t>& g = records_[it->second.front()].global_shape;
    std::int64_t g_numel = 1;
    for (std::int64_t d : g) g_numel *= d;
    const bool rows_only = g.size() == spec.full_shape.size() &&
                           std::equal(g.begin() + 1, g.end(), spec.full_shape.begin() + 1);
    if (!rows_only ||
        (g[0] != spec.full_shape[0] && (spec.name != "wte.weight" || g[0] < spec.real_rows))) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir_, ": ", spec.name, " is ", absl::StrJoin(g, "x"), " there, ",
                       absl::StrJoin(spec.full_shape, "x"), " here"));
    }
    const std::int64_t lb = b - spec.offset, le = e - spec.offset;
    float* dst = p.data + (b - p.begin);
    std::vector<bool> seen(static_cast<std::size_t>(le - lb), false);
    for (std::size_t k : it->second) {
      const TensorRecord& r = records_[k];
      if (r.split == Split::kNone && r.t != 0) continue;  // replicated: t = 0's copy
      if (!may_overlap(r, spec, lb, le)) continue;
      if (absl::Status st = read_piece(r, &bytes); !st.ok()) return st;
      const float* src = reinterpret_cast<const float*>(bytes.data());
      const ParamSpec old = slice_spec(r);
      for (std::int64_t x = r.begin; x < r.end; x++) {
        const std::int64_t i = spec.local_index(old.global_index(x));
        if (i < lb || i >= le) continue;
        dst[i - lb] = src[x - r.begin];
        seen[static_cast<std::size_t>(i - lb)] = true;
      }
    }
    std::int64_t missing = 0;
    for (std::int64_t i = lb; i < le; i++) {
      if (seen[static_cast<std::size_t>(i - lb)]) continue;
      if (spec.global_index(i) >= g_numel) {
        dst[i - lb] = 0.0f;  // a padding row the writer's padding lacks
      } else {
        missing++;
      }
    }
    if (missing > 0) {
      return absl::DataLossError(
          absl::StrCat(dir_, ": ", missing, " elements of ", key, " are in no rank's file"));
    }
  }
  return absl::OkStatus();
}

}  // namespace troupe::model::ckpt
