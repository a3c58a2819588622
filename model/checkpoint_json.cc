// The checkpoint manifest: JSON out, checked JSON in.
#include "model/checkpoint_json.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace troupe::model::ckpt {
using nlohmann::json;

namespace {

const char* split_name(Split s) {
  switch (s) {
    case Split::kNone:
      return "none";
    case Split::kRows:
      return "rows";
    case Split::kCols:
      return "cols";
    case Split::kQkvRows:
      return "qkv_rows";
  }
  return "none";
}

// Reads fields of a JSON object, keeping the first problem.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) error_ = absl::StrCat(where_, ": not a JSON object");
  }
  template <class T>
  void get(const char* key, T* out) {
    if (!error_.empty()) return;
    auto it = j_.find(key);
    if (it == j_.end()) {
      error_ = absl::StrCat(where_, ": no \"", key, "\"");
      return;
    }
    try {
      *out = it->get<T>();
    } catch (const json::exception&) {
      error_ = absl::StrCat(where_, ": \"", key, "\" has the wrong type");
    }
  }
  const json* object(const char* key) {
    if (!error_.empty()) return nullptr;
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_object()) {
      error_ = absl::StrCat(where_, ": no object \"", key, "\"");
      return nullptr;
    }
    return &*it;
  }
  void fail(std::string what) {
    if (error_.empty()) error_ = absl::StrCat(where_, ": ", what);
  }
  absl::Status status() const {
    return error_.empty() ? absl::OkStatus() : absl::InvalidArgumentError(error_);
  }

 private:
  const json& j_;
  std::string where_;
  std::string error_;
};

json options_json(const TrainOptions& o) {
  const GptConfig& c = o.model;
  return {{"model",
           {{"name", c.name},
            {"layers", c.L},
            {"channels", c.C},
            {"heads", c.NH},
            {"seq_len", c.T},
            {"vocab_size", c.V},
            {"vocab_multiple", c.vocab_multiple},
            {"padded_vocab_size", c.Vp()}}},
          {"micro_batch_size", o.micro_batch},
          {"global_batch_size", o.global_batch},
          {"train_steps", o.steps},
          {"train_samples", o.train_samples},
          {"rampup_batch_size",
           o.rampup.enabled() ? json::array({o.rampup.start, o.rampup.increment, o.rampup.samples})
                              : json::array()},
          {"lr_schedule",
           {{"lr", o.lr.lr},
            {"min_lr", o.lr.min_lr},
            {"warmup_iters", o.lr.warmup_iters},
            {"decay_iters", o.lr.decay_iters},
            {"warmup_samples", o.lr.warmup_samples},
            {"decay_samples", o.lr.decay_samples},
            {"style", "cosine"}}},
          {"adam",
           {{"beta1", o.adam.beta1},
            {"beta2", o.adam.beta2},
            {"eps", o.adam.eps},
            {"weight_decay", o.adam.weight_decay}}},
          {"clip_grad", o.clip_grad},
          {"precision", gpu::precision_name(o.activations.precision)},
          {"seed", o.seed},
          {"data",
           {{"data_path", o.data_path},
            {"split", o.split},
            {"shuffle", o.shuffle},
            {"eval_interval", o.eval_interval},
            {"eval_iters", o.eval_iters}}}};
}

void read_options(const json& j, const std::string& where, Reader& top, TrainOptions* o) {
  Reader r(j, where);
  if (const json* m = r.object("model")) {
    Reader mr(*m, absl::StrCat(where, ".model"));
    mr.get("name", &o->model.name);
    mr.get("layers", &o->model.L);
    mr.get("channels", &o->model.C);
    mr.get("heads", &o->model.NH);
    mr.get("seq_len", &o->model.T);
    mr.get("vocab_size", &o->model.V);
    mr.get("vocab_multiple", &o->model.vocab_multiple);
    if (!mr.status().ok()) r.fail(std::string(mr.status().message()));
  }
  r.get("micro_batch_size", &o->micro_batch);
  r.get("global_batch_size", &o->global_batch);
  r.get("train_steps", &o->steps);
  // (Absent in checkpoints written before the ramp-up existed: none.)
  if (j.contains("train_samples")) r.get("train_samples", &o->train_samples);
  if (j.contains("rampup_batch_size") && j["rampup_batch_size"].is_array() &&
      j["rampup_batch_size"].size() == 3) {
    const json& ru = j["rampup_batch_size"];
    if (ru[0].is_number_integer() && ru[1].is_number_integer() && ru[2].is_number_integer()) {
      o->rampup = {.start = ru[0].get<int>(),
                   .increment = ru[1].get<int>(),
                   .samples = ru[2].get<std::int64_t>()};
    } else {
      r.fail(absl::StrCat(where, ".rampup_batch_size: expected three integers"));
    }
  }
  if (const json* l = r.object("lr_schedule")) {
    Reader lr(*l, absl::StrCat(where, ".lr_schedule"));
    lr.get("lr", &o->lr.lr);
    lr.get("min_lr", &o->lr.min_lr);
    lr.get("warmup_iters", &o->lr.warmup_iters);
    lr.get("decay_iters", &o->lr.decay_iters);
    if (l->contains("warmup_samples")) lr.get("warmup_samples", &o->lr.warmup_samples);
    if (l->contains("decay_samples")) lr.get("decay_samples", &o->lr.decay_samples);
    if (!lr.status().ok()) r.fail(std::string(lr.status().message()));
  }
  if (const json* a = r.object("adam")) {
    Reader ar(*a, absl::StrCat(where, ".adam"));
    ar.get("beta1", &o->adam.beta1);
    ar.get("beta2", &o->adam.beta2);
    ar.get("eps", &o->adam.eps);
    ar.get("weight_decay", &o->adam.weight_decay);
    if (!ar.status().ok()) r.fail(std::string(ar.status().message()));
  }
  r.get("clip_grad", &o->clip_grad);
  if (j.contains("precision")) {  // (older checkpoints: fp32)
    std::string name;
    r.get("precision", &name);
    bool known = false;
    for (gpu::Precision p : {gpu::Precision::kFp32, gpu::Precision::kBf16, gpu::Precision::kFp16}) {
      if (name == gpu::precision_name(p)) {
        o->activations.precision = p;
        known = true;
      }
    }
    if (r.status().ok() && !known) r.fail(absl::StrCat("unknown precision \"", name, "\""));
  }
  r.get("seed", &o->seed);
  if (const json* d = r.object("data")) {
    Reader dr(*d, absl::StrCat(where, ".data"));
    dr.get("data_path", &o->data_path);
    dr.get("split", &o->split);
    dr.get("shuffle", &o->shuffle);
    dr.get("eval_interval", &o->eval_interval);
    dr.get("eval_iters", &o->eval_iters);
    if (!dr.status().ok()) r.fail(std::string(dr.status().message()));
  }
  if (!r.status().ok()) top.fail(std::string(r.status().message()));
}

}  // namespace

json record_json(const TensorRecord& r) {
  return {{"file", r.file},
          {"name", r.name},
          {"param", r.param},
          {"kind", kind_name(r.kind)},
          {"global_shape", r.global_shape},
          {"slice_shape", r.slice_shape},
          {"split", split_name(r.split)},
          {"tp", r.tp},
          {"t", r.t},
          {"begin", r.begin},
          {"end", r.end},
          {"crc32", r.crc32}};
}

absl::StatusOr<TensorRecord> record_from_json(const json& j) {
  TensorRecord r;
  Reader rd(j, "a tensor record");
  std::string kind, split;
  rd.get("file", &r.file);
  rd.get("name", &r.name);
  rd.get("param", &r.param);
  rd.get("kind", &kind);
  rd.get("global_shape", &r.global_shape);
  rd.get("slice_shape", &r.slice_shape);
  rd.get("split", &split);
  rd.get("tp", &r.tp);
  rd.get("t", &r.t);
  rd.get("begin", &r.begin);
  rd.get("end", &r.end);
  rd.get("crc32", &r.crc32);
  if (absl::Status st = rd.status(); !st.ok()) return st;
  bool kind_ok = false, split_ok = false;
  for (Kind k : {Kind::kParam, Kind::kMaster, Kind::kAdamM, Kind::kAdamV}) {
    if (kind == kind_name(k)) r.kind = k, kind_ok = true;
  }
  for (Split s : {Split::kNone, Split::kRows, Split::kCols, Split::kQkvRows}) {
    if (split == split_name(s)) r.split = s, split_ok = true;
  }
  const std::string what = absl::StrCat("tensor ", r.name, " of ", r.file);
  if (!kind_ok) return absl::InvalidArgumentError(absl::StrCat(what, ": unknown kind ", kind));
  if (!split_ok) return absl::InvalidArgumentError(absl::StrCat(what, ": unknown split ", split));
  // The shapes must describe a slice whose elements global_index() maps
  // into the global tensor: checked here, once, for every reader.
  // (Every product stays far inside int64: at most 2^40 elements, tp at
  // most 32768.)
  constexpr std::int64_t kMax = std::int64_t{1} << 40;
  auto numel = [](const std::vector<std::int64_t>& s) {
    if (s.empty() || s.size() > 2) return std::int64_t{-1};
    std::int64_t n = 1;
    for (std::int64_t d : s) {
      if (d <= 0 || d > kMax / n) return std::int64_t{-1};
      n *= d;
    }
    return n;
  };
  const std::int64_t full = numel(r.global_shape), slice = numel(r.slice_shape);
  bool ok = full > 0 && slice > 0 && r.tp >= 1 && r.tp <= 32768 && r.t >= 0 && r.t < r.tp &&
            r.global_shape.size() == r.slice_shape.size() && r.begin >= 0 && r.begin < r.end &&
            r.end <= slice;
  if (ok) {
    const std::size_t dims = r.global_shape.size();
    const std::int64_t rows = r.global_shape[0], srows = r.slice_shape[0];
    const std::int64_t cols = dims > 1 ? r.global_shape[1] : 1;
    const std::int64_t scols = dims > 1 ? r.slice_shape[1] : 1;
    switch (r.split) {
      case Split::kNone:
        ok = full == slice;
        break;
      case Split::kRows:
        ok = srows * r.tp == rows && scols == cols;
        break;
      case Split::kQkvRows:
        ok = srows * r.tp == rows && scols == cols && srows % 3 == 0;
        break;
      case Split::kCols:
        ok = dims == 2 && scols * r.tp == cols && srows == rows;
        break;
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": its shapes, slice and range do not fit together"));
  }
  return r;
}

std::string manifest_text(const Meta& m, const std::vector<TensorRecord>& records) {
  json tensors = json::array();
  for (const TensorRecord& r : records) tensors.push_back(record_json(r));
  json ranks = json::array();
  for (int r = 0; r < m.world(); r++) ranks.push_back(rank_file_name(r));
  json j = {{"format", "troupe-checkpoint"},
            {"format_version", kFormat},
            {"writer", m.writer},
            {"step", m.step},
            {"consumed_samples", m.consumed_samples},
            {"evaluations_done", m.evaluations_done},
            {"layout",
             {{"tp", m.tp},
              {"pp", m.pp},
              {"dp", m.dp},
              {"virtual_stages", m.virtual_stages},
              {"schedule", m.schedule}}},
            {"options", options_json(m.options)},
            {"rank_files", ranks},
            {"tensors", tensors}};
  if (const std::optional<LossScaleState>& s = m.loss_scale) {
    j["loss_scaler"] = {{"scale", s->scale},
                        {"growth_tracker", s->growth_tracker},
                        {"hysteresis_tracker", s->hysteresis_tracker},
                        {"skipped_iters", s->skipped_iters},
                        {"skipped_samples", s->skipped_samples}};
  }
  return j.dump(1) + "\n";
}

absl::Status parse_manifest(const std::string& text, const std::string& path, Meta* m,
                            std::vector<TensorRecord>* records) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  Reader r(j, path);
  std::string format;
  int version = 0;
  r.get("format", &format);
  if (r.status().ok() && format != "troupe-checkpoint") r.fail("not a troupe checkpoint manifest");
  r.get("format_version", &version);
  if (r.status().ok() && version != kFormat) {
    r.fail(absl::StrCat("format version ", version, "; this troupe reads version ", kFormat));
  }
  r.get("writer", &m->writer);
  r.get("step", &m->step);
  r.get("consumed_samples", &m->consumed_samples);
  r.get("evaluations_done", &m->evaluations_done);
  if (j.contains("loss_scaler")) {  // (older checkpoints: none)
    if (const json* l = r.object("loss_scaler")) {
      Reader lr(*l, absl::StrCat(path, ": loss_scaler"));
      LossScaleState& s = m->loss_scale.emplace();
      lr.get("scale", &s.scale);
      lr.get("growth_tracker", &s.growth_tracker);
      lr.get("hysteresis_tracker", &s.hysteresis_tracker);
      lr.get("skipped_iters", &s.skipped_iters);
      lr.get("skipped_samples", &s.skipped_samples);
      if (!lr.status().ok()) r.fail(std::string(lr.status().message()));
      if (r.status().ok() &&
          (!(s.scale > 0) || std::isinf(s.scale) || s.skipped_iters < 0 || s.skipped_samples < 0)) {
        r.fail("loss_scaler: the scale must be positive and finite, the skip counts not negative");
      }
    }
  }
  if (const json* l = r.object("layout")) {
    Reader lr(*l, absl::StrCat(path, ": layout"));
    lr.get("tp", &m->tp);
    lr.get("pp", &m->pp);
    lr.get("dp", &m->dp);
    lr.get("virtual_stages", &m->virtual_stages);
    lr.get("schedule", &m->schedule);
    if (!lr.status().ok()) r.fail(std::string(lr.status().message()));
  }
  if (const json* o = r.object("options"))
    read_options(*o, absl::StrCat(path, ": options"), r, &m->options);
  if (absl::Status st = r.status(); !st.ok()) return st;
  auto in = [](int x) { return x >= 1 && x <= 32768; };  // (no product overflows)
  if (m->step < 0 || !in(m->tp) || !in(m->pp) || !in(m->dp) || !in(m->virtual_stages) ||
      static_cast<std::int64_t>(m->tp) * m->pp * m->dp > 32768) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the step or layout is out of range"));
  }
  auto t = j.find("tensors");
  if (t == j.end() || !t->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"tensors\" array"));
  }
  for (const json& e : *t) {
    absl::StatusOr<TensorRecord> rec = record_from_json(e);
    if (!rec.ok())
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", rec.status().message()));
    records->push_back(std::move(*rec));
  }
  return absl::OkStatus();
}

}  // namespace troupe::model::ckpt
