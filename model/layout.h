// The parameter layout of a GPT: every named tensor, its shape and its place
// in one flat buffer (parameters, gradients and optimizer state are all carved
// the same way).
//
// Order is layer-major so that a pipeline stage's parameters are one
// contiguous range: [wte, wpe] [h.0.*] ... [h.{L-1}.*] [ln_f.*].
// Names are Hugging Face GPT-2's. Matrices are stored as PyTorch's
// nn.Linear, (out, in); the file layout of GPT-2's Conv1D is (in, out), which
// `transposed_in_file` marks.
//
//   ParamLayout lay = ParamLayout::gpt(config);
//   const ParamSpec& w = lay.find("h.0.attn.c_attn.weight");  // (3C, C)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gpu/tensor.h"
#include "model/config.h"

namespace troupe::model {

// The part of the model one pipeline stage holds: layers [first, last), the
// embeddings on the first stage, the final LayerNorm and LM head on the last.
// The LM head is tied to the token embedding, so wte is on both ends.
struct StageSpec {
  int first_layer = 0;
  int last_layer = 0;  // exclusive
  bool embedding = true;
  bool head = true;
  int layers() const { return last_layer - first_layer; }
  // All of the model (one stage).
  static StageSpec whole(const GptConfig& config) { return {0, config.L, true, true}; }
  // Stage s of pp equal stages; L must be a multiple of pp.
  static StageSpec pipeline(const GptConfig& config, int pp, int s) {
    const int per = config.L / pp;
    return {s * per, (s + 1) * per, s == 0, s == pp - 1};
  }
};

// One tensor-parallel rank's slice: t of tp (Megatron's tensor slicing).
struct TpSlice {
  int tp = 1;
  int t = 0;
};

// How tensor parallelism slices a parameter: not at all (replicated on
// every TP rank: LayerNorms, position embedding, row-parallel biases), by
// rows (vocab-parallel wte, column-parallel c_fc), by columns (row-parallel
// c_proj), or the fused qkv's rows, each of q, k and v by heads.
enum class Split { kNone, kRows, kCols, kQkvRows };

enum class Decay { kNo, kYes };  // AdamW weight decay (not biases, LN, as Megatron)
enum class Init { kNormal, kNormalScaled, kZeros, kOnes };

struct ParamSpec {
  std::string name;
  gpu::Shape shape;         // as stored here (this rank's slice)
  gpu::Shape full_shape;    // unsliced
  std::int64_t offset = 0;  // in elements, into the flat buffer
  Decay decay = Decay::kNo;
  Init init = Init::kZeros;
  bool transposed_in_file = false;  // Conv1D weights: file holds shape reversed
  // Rows of the unsliced tensor that exist in the file and are initialised
  // (wte: V of Vp rows).
  std::int64_t real_rows = 0;
  int layer = -1;  // -1: embedding or final LN
  Split split = Split::kNone;
  TpSlice slice;

  std::int64_t numel() const { return gpu::shape_numel(shape); }
  bool replicated() const { return split == Split::kNone || slice.tp == 1; }
  // Index in the unsliced tensor (row-major) of this slice's element i.
  std::int64_t global_index(std::int64_t i) const;
  // Its inverse: the slice's element at global index g, -1 when g is in
  // another slice (or past the tensor).
  std::int64_t local_index(std::int64_t g) const;
};

class ParamLayout {
 public:
  // Rank t of tp's slice of `stage` (Vp and NH must divide by tp).
  static ParamLayout gpt(const GptConfig& config, StageSpec stage, TpSlice slice = {});
  static ParamLayout gpt(const GptConfig& config) { return gpt(config, StageSpec::whole(config)); }

  const std::vector<ParamSpec>& specs() const { return specs_; }
  // The parameter called `name`: NotFound naming it when this layout has
  // none (the check for names from input: files, flags, other layouts).
  absl::StatusOr<const ParamSpec*> lookup(const std::string& name) const;
  const ParamSpec* find_or_null(const std::string& name) const;
  // lookup() for names the caller knows are here; a missing one ends the
  // process with lookup's message in every build type.
  const ParamSpec& find(const std::string& name) const;
  std::int64_t total() const { return total_; }

  // Views of `flat` (contiguous, total() elements of f32, bf16 or f16: the
  // parameters' compute copy, the fp32 gradients) by parameter.
  // try_view: InvalidArgument when `flat` is not such a buffer, NotFound
  // for an unknown name; view: the same checks, fatal (as Tensor::view).
  absl::StatusOr<gpu::Tensor> try_view(const gpu::Tensor& flat, const std::string& name) const;
  gpu::Tensor view(const gpu::Tensor& flat, const ParamSpec& spec) const;
  gpu::Tensor view(const gpu::Tensor& flat, const std::string& name) const {
    return view(flat, find(name));
  }

 private:
  void add(std::string name, gpu::Shape shape, Decay decay, Init init, int layer,
           bool transposed_in_file = false, std::int64_t real_rows = -1,
           Split split = Split::kNone);

  TpSlice slice_;

  std::vector<ParamSpec> specs_;
  absl::flat_hash_map<std::string, std::size_t> index_;
  std::int64_t total_ = 0;
};

}  // namespace troupe::model
