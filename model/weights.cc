// Saving and loading GPT weights as Hugging Face GPT-2 safetensors.
#include "model/weights.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/safetensors.h"

namespace troupe::model {
namespace {

// The file's shape of a parameter (Conv1D weights transposed, wte unpadded).
std::vector<std::int64_t> file_shape(const ParamSpec& spec) {
  std::vector<std::int64_t> shape(spec.shape.begin(), spec.shape.end());
  shape[0] = spec.real_rows;
  if (spec.transposed_in_file) std::swap(shape[0], shape[1]);
  return shape;
}

void transpose(const float* src, float* dst, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; r++) {
    for (std::int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
  }
}

std::map<std::string, std::string> config_metadata(const GptConfig& c) {
  return {{"format", "pt"},
          {"n_layer", std::to_string(c.L)},
          {"n_embd", std::to_string(c.C)},
          {"n_head", std::to_string(c.NH)},
          {"vocab_size", std::to_string(c.V)},
          {"n_ctx", std::to_string(c.T)}};
}

absl::Status check_metadata(const SafetensorsFile& f, const GptConfig& c) {
  const std::pair<const char*, int> want[] = {
      {"n_layer", c.L}, {"n_embd", c.C}, {"n_head", c.NH}, {"vocab_size", c.V}, {"n_ctx", c.T}};
  for (const auto& [key, value] : want) {
    auto it = f.metadata().find(key);
    if (it == f.metadata().end()) continue;  // files from elsewhere may carry only "format"
    int got = 0;
    if (!absl::SimpleAtoi(it->second, &got)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": metadata ", key, " = '", it->second, "' is not an integer"));
    }
    if (got != value) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": metadata ", key, " = ", got, " but the model has ", value));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GptConfig> weights_config(const std::string& path, const GptConfig& base) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::open(path, SafetensorsFile::Read::kHeader);
  if (!f.ok()) return f.status();
  GptConfig c = base;
  const std::pair<const char*, int*> keys[] = {{"n_layer", &c.L},
                                               {"n_embd", &c.C},
                                               {"n_head", &c.NH},
                                               {"vocab_size", &c.V},
                                               {"n_ctx", &c.T}};
  for (const auto& [key, field] : keys) {
    auto it = f->metadata().find(key);
    if (it == f->metadata().end()) continue;
    if (!absl::SimpleAtoi(it->second, field) || *field <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": metadata ", key, " = '", it->second,
                                                     "' is not a positive integer"));
    }
  }
  if (absl::Status st = c.validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  }
  return c;
}

namespace {

// Whether a name in the file may be ignored.
bool ignorable(absl::string_view name) {
  return absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias");
}

std::string strip_prefix(const std::string& name) {
  constexpr absl::string_view kPrefix = "transformer.";
  return absl::StartsWith(name, kPrefix) ? name.substr(kPrefix.size()) : name;
}

absl::Status load_param(const SafetensorsFile& f, const SafetensorsEntry& e, const char* bytes,
                        const ParamSpec& spec, float* dst) {
  auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", e.name, "' ", what));
  };
  if (e.dtype != "F32") return fail(absl::StrCat("has dtype ", e.dtype, ", want F32"));
  std::vector<std::int64_t> want = file_shape(spec);
  std::vector<std::int64_t> padded(spec.shape.begin(), spec.shape.end());  // wte with Vp rows
  const bool is_padded_wte = spec.real_rows != spec.shape[0] && e.shape == padded;
  if (e.shape != want && !is_padded_wte) {
    return fail(absl::StrCat("has shape [", absl::StrJoin(e.shape, ", "), "], want [",
                             absl::StrJoin(want, ", "), "]"));
  }
  const auto* src = reinterpret_cast<const float*>(bytes);
  if (spec.transposed_in_file) {
    transpose(src, dst, spec.shape[1], spec.shape[0]);  // file (in, out) -> (out, in)
  } else {
    const std::int64_t row = spec.numel() / spec.shape[0];
    std::memcpy(dst, src, static_cast<std::size_t>(spec.real_rows * row) * sizeof(float));
    std::memset(dst + spec.real_rows * row, 0,
                static_cast<std::size_t>((spec.shape[0] - spec.real_rows) * row) * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status save_weights(const Gpt& gpt, const std::string& path) {
  const ParamLayout& lay = gpt.layout();
  std::vector<float> host(static_cast<std::size_t>(lay.total()));
  absl::Status st = gpt.copy_params_to_host(host);  // (bf16/fp16 ones widened)
  if (!st.ok()) return st;
  std::vector<std::vector<float>> transposed;
  transposed.reserve(lay.specs().size());
  std::vector<TensorToWrite> tensors;
  for (const ParamSpec& spec : lay.specs()) {
    TensorToWrite t;
    t.name = spec.name;
    t.dtype = "F32";
    t.shape = file_shape(spec);
    const float* src = host.data() + spec.offset;
    if (spec.transposed_in_file) {
      transposed.emplace_back(static_cast<std::size_t>(spec.numel()));
      transpose(src, transposed.back().data(), spec.shape[0], spec.shape[1]);
      src = transposed.back().data();
    }
    t.data = src;
    t.nbytes =
        static_cast<std::size_t>(spec.real_rows * (spec.numel() / spec.shape[0])) * sizeof(float);
    tensors.push_back(std::move(t));
  }
  return write_safetensors(path, tensors, config_metadata(gpt.config()));
}

absl::Status load_weights(const std::string& path, Gpt& gpt) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::open(path);
  if (!f.ok()) return f.status();
  absl::Status st = check_metadata(*f, gpt.config());
  if (!st.ok()) return st;
  const ParamLayout& lay = gpt.layout();
  std::vector<float> host(static_cast<std::size_t>(lay.total()), 0.0f);
  std::vector<bool> seen(lay.specs().size(), false);
  const SafetensorsEntry* lm_head = nullptr;
  for (const SafetensorsEntry& e : f->entries()) {
    const std::string name = strip_prefix(e.name);
    if (name == "lm_head.weight") {
      lm_head = &e;
      continue;
    }
    if (ignorable(name)) continue;
    const ParamSpec* spec = lay.find_or_null(name);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected tensor '", e.name,
                                                     "' (not a parameter of ",
                                                     gpt.config().describe(), ")"));
    }
    const std::size_t i = static_cast<std::size_t>(spec - lay.specs().data());
    if (seen[i]) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' appears twice"));
    }
    seen[i] = true;
    st = load_param(*f, e, f->bytes(e).data(), *spec, host.data() + spec->offset);
    if (!st.ok()) return st;
  }
  for (std::size_t i = 0; i < seen.size(); i++) {
    if (!seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": missing tensor '", lay.specs()[i].name, "'"));
    }
  }
  if (lm_head != nullptr) {
    // The LM head is tied to the token embedding; accept it only if equal.
    absl::StatusOr<const ParamSpec*> wte_spec = lay.lookup("wte.weight");
    if (!wte_spec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", lm_head->name, "' but the model has no wte.weight to tie it to"));
    }
    const ParamSpec& wte = **wte_spec;
    std::vector<float> head(static_cast<std::size_t>(wte.numel()));
    st = load_param(*f, *lm_head, f->bytes(*lm_head).data(), wte, head.data());
    if (!st.ok()) return st;
    if (std::memcmp(head.data(), host.data() + wte.offset, head.size() * sizeof(float)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", lm_head->name, "' differs from wte.weight; troupe ties them"));
    }
  }
  return gpt.copy_params_from_host(host);  // (rounded to bf16/fp16 ones)
}

absl::Status load_weights_slice(const std::string& path, const GptConfig& config,
                                const ParamLayout& layout, float* params) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::open(path, SafetensorsFile::Read::kHeader);
  if (!f.ok()) return f.status();
  if (absl::Status st = check_metadata(*f, config); !st.ok()) return st;
  // The whole file's names are checked as load_weights checks them (from
  // the header alone), so that a file loads on every layout or on none.
  const ParamLayout whole = ParamLayout::gpt(config);
  std::map<std::string, const SafetensorsEntry*> entry;  // by parameter name
  const SafetensorsEntry* lm_head = nullptr;
  for (const SafetensorsEntry& e : f->entries()) {
    const std::string name = strip_prefix(e.name);
    if (name == "lm_head.weight") {
      lm_head = &e;
      continue;
    }
    if (ignorable(name)) continue;
    if (whole.find_or_null(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": unexpected tensor '", e.name, "' (not a parameter of ", config.describe(), ")"));
    }
    if (!entry.emplace(name, &e).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' appears twice"));
    }
  }
  for (const ParamSpec& spec : whole.specs()) {
    if (!entry.count(spec.name)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": missing tensor '", spec.name, "'"));
    }
  }
  // Only this slice's tensors are read: each whole, then sliced by
  // global_index (a TP slice reads its tensors' other slices too).
  std::vector<char> bytes;
  std::vector<float> full;
  for (const ParamSpec& spec : layout.specs()) {
    const ParamSpec* w = whole.find_or_null(spec.name);
    if (w == nullptr || w->shape != spec.full_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the model has no tensor ", spec.name, " of this size"));
    }
    const SafetensorsEntry& e = *entry[spec.name];
    if (absl::Status st = f->read(e, &bytes); !st.ok()) return st;
    // An unsliced tensor is converted straight into its place; a TP slice
    // takes its elements from the whole tensor.
    float* dst = params + spec.offset;
    const bool whole_tensor = spec.replicated();
    full.resize(whole_tensor ? 0 : static_cast<std::size_t>(w->numel()));
    float* into = whole_tensor ? dst : full.data();
    if (absl::Status st = load_param(*f, e, bytes.data(), *w, into); !st.ok()) return st;
    if (spec.name == "wte.weight" && lm_head != nullptr) {
      // The LM head is tied to the token embedding; accept it only if equal.
      std::vector<float> head(static_cast<std::size_t>(w->numel()));
      if (absl::Status st = f->read(*lm_head, &bytes); !st.ok()) return st;
      if (absl::Status st = load_param(*f, *lm_head, bytes.data(), *w, head.data()); !st.ok()) {
        return st;
      }
      if (std::memcmp(head.data(), into, head.size() * sizeof(float)) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", lm_head->name, "' differs from wte.weight; troupe ties them"));
      }
    }
    if (whole_tensor) continue;
    for (std::int64_t i = 0; i < spec.numel(); i++)
      dst[i] = full[static_cast<std::size_t>(spec.global_index(i))];
  }
  return absl::OkStatus();
}

}  // namespace troupe::model
