// The GPT-2 parameter layout.
#include "model/layout.h"

#include "absl/strings/str_cat.h"

namespace troupe::model {

std::int64_t ParamSpec::global_index(std::int64_t i) const {
  if (replicated()) return i;
  const std::int64_t cols = shape.size() > 1 ? shape[1] : 1;  // of the slice
  const std::int64_t r = i / cols, c = i % cols;
  switch (split) {
    case Split::kRows:
      return (slice.t * shape[0] + r) * cols + c;
    case Split::kCols:
      return r * full_shape[1] + slice.t * cols + c;
    case Split::kQkvRows: {
      const std::int64_t part = shape[0] / 3;  // this rank's rows of each of q, k, v
      const std::int64_t full_part = full_shape[0] / 3;
      return ((r / part) * full_part + slice.t * part + r % part) * cols + c;
    }
    case Split::kNone:
      break;
  }
  return i;
}

std::int64_t ParamSpec::local_index(std::int64_t g) const {
  if (g < 0) return -1;
  if (replicated()) return g < numel() ? g : -1;
  const std::int64_t cols = shape.size() > 1 ? shape[1] : 1;  // of the slice
  std::int64_t i = -1;
  switch (split) {
    case Split::kRows: {
      const std::int64_t row = g / cols;
      if (row / shape[0] == slice.t) i = (row - slice.t * shape[0]) * cols + g % cols;
      break;
    }
    case Split::kCols: {
      const std::int64_t full_cols = full_shape[1];
      const std::int64_t c = g % full_cols;
      if (c / cols == slice.t) i = (g / full_cols) * cols + (c - slice.t * cols);
      break;
    }
    case Split::kQkvRows: {
      const std::int64_t part = shape[0] / 3, full_part = full_shape[0] / 3;
      const std::int64_t row = g / cols, which = row / full_part, within = row % full_part;
      if (within / part == slice.t) i = (which * part + within - slice.t * part) * cols + g % cols;
      break;
    }
    case Split::kNone:
      break;
  }
  return i < numel() ? i : -1;
}

void ParamLayout::add(std::string name, gpu::Shape shape, Decay decay, Init init, int layer,
                      bool transposed_in_file, std::int64_t real_rows, Split split) {
  ParamSpec s;
  s.name = std::move(name);
  s.full_shape = shape;
  s.split = slice_.tp > 1 ? split : Split::kNone;
  s.slice = slice_;
  if (s.split == Split::kRows || s.split == Split::kQkvRows) shape[0] /= slice_.tp;
  if (s.split == Split::kCols) shape[1] /= slice_.tp;
  s.shape = std::move(shape);
  s.offset = total_;
  s.decay = decay;
  s.init = init;
  s.transposed_in_file = transposed_in_file;
  s.real_rows = real_rows >= 0 ? real_rows : s.full_shape[0];
  s.layer = layer;
  // Keep every tensor 16-element aligned in the flat buffer (64 bytes in
  // fp32, 32 in bf16: whole 128-bit vectors either way).
  total_ += (s.numel() + 15) / 16 * 16;
  index_[s.name] = specs_.size();
  specs_.push_back(std::move(s));
}

ParamLayout ParamLayout::gpt(const GptConfig& c, StageSpec stage, TpSlice slice) {
  ParamLayout lay;
  lay.slice_ = slice;
  const std::int64_t C = c.C;
  if (stage.embedding || stage.head) {
    lay.add("wte.weight", {c.Vp(), C}, Decay::kYes, Init::kNormal, -1, false, c.V, Split::kRows);
  }
  if (stage.embedding) lay.add("wpe.weight", {c.T, C}, Decay::kYes, Init::kNormal, -1);
  for (int l = stage.first_layer; l < stage.last_layer; l++) {
    const std::string h = absl::StrCat("h.", l, ".");
    lay.add(h + "ln_1.weight", {C}, Decay::kNo, Init::kOnes, l);
    lay.add(h + "ln_1.bias", {C}, Decay::kNo, Init::kZeros, l);
    lay.add(h + "attn.c_attn.weight", {3 * C, C}, Decay::kYes, Init::kNormal, l, true, -1,
            Split::kQkvRows);
    lay.add(h + "attn.c_attn.bias", {3 * C}, Decay::kNo, Init::kZeros, l, false, -1,
            Split::kQkvRows);
    lay.add(h + "attn.c_proj.weight", {C, C}, Decay::kYes, Init::kNormalScaled, l, true, -1,
            Split::kCols);
    lay.add(h + "attn.c_proj.bias", {C}, Decay::kNo, Init::kZeros, l);
    lay.add(h + "ln_2.weight", {C}, Decay::kNo, Init::kOnes, l);
    lay.add(h + "ln_2.bias", {C}, Decay::kNo, Init::kZeros, l);
    lay.add(h + "mlp.c_fc.weight", {4 * C, C}, Decay::kYes, Init::kNormal, l, true, -1,
            Split::kRows);
    lay.add(h + "mlp.c_fc.bias", {4 * C}, Decay::kNo, Init::kZeros, l, false, -1, Split::kRows);
    lay.add(h + "mlp.c_proj.weight", {C, 4 * C}, Decay::kYes, Init::kNormalScaled, l, true, -1,
            Split::kCols);
    lay.add(h + "mlp.c_proj.bias", {C}, Decay::kNo, Init::kZeros, l);
  }
  if (stage.head) {
    lay.add("ln_f.weight", {C}, Decay::kNo, Init::kOnes, -1);
    lay.add("ln_f.bias", {C}, Decay::kNo, Init::kZeros, -1);
  }
  return lay;
}

const ParamSpec* ParamLayout::find_or_null(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

absl::StatusOr<const ParamSpec*> ParamLayout::lookup(const std::string& name) const {
  const ParamSpec* s = find_or_null(name);
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no parameter '", name, "' in this layout (", specs_.size(), " parameters",
        specs_.empty()
            ? ""
            : absl::StrCat(", '", specs_.front().name, "' to '", specs_.back().name, "'"),
        ")"));
  }
  return s;
}

namespace {

absl::Status check_flat(const gpu::Tensor& flat, std::int64_t total) {
  if (!flat.defined() || !gpu::is_compute_dtype(flat.dtype) || flat.numel() != total ||
      !flat.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter view of ", flat.defined() ? flat.describe() : "an undefined tensor",
                     ": want the layout's flat buffer, f32, bf16 or f16 [", total, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

const ParamSpec& ParamLayout::find(const std::string& name) const {
  absl::StatusOr<const ParamSpec*> s = lookup(name);
  gpu::check_invariant(s.status(), "ParamLayout::find");
  return **s;
}

absl::StatusOr<gpu::Tensor> ParamLayout::try_view(const gpu::Tensor& flat,
                                                  const std::string& name) const {
  absl::StatusOr<const ParamSpec*> spec = lookup(name);
  if (!spec.ok()) return spec.status();
  if (absl::Status st = check_flat(flat, total_); !st.ok()) return st;
  return flat.try_view((*spec)->offset, (*spec)->shape);
}

gpu::Tensor ParamLayout::view(const gpu::Tensor& flat, const ParamSpec& spec) const {
  gpu::check_invariant(check_flat(flat, total_), "ParamLayout::view");
  return flat.view(spec.offset, spec.shape);
}

}  // namespace troupe::model
