// Gpt's buffers: the parameter views, and the activation slots, recompute
// workspace and scratch carved out of one allocation each, sized by the same
// code that carves them (so the planner's counts are what Gpt allocates).
#include "model/gpt_buffers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace troupe::model {

using gpu::Tensor;

GptParams GptParams::carve(const ParamLayout& lay, const Tensor& flat, const StageSpec& stage) {
  GptParams p;
  if (stage.embedding || stage.head) p.wte = lay.view(flat, "wte.weight");
  if (stage.embedding) p.wpe = lay.view(flat, "wpe.weight");
  for (int l = stage.first_layer; l < stage.last_layer; l++) {
    const std::string h = absl::StrCat("h.", l, ".");
    auto v = [&](const char* n) { return lay.view(flat, h + n); };
    p.h.push_back({v("ln_1.weight"), v("ln_1.bias"), v("attn.c_attn.weight"), v("attn.c_attn.bias"),
                   v("attn.c_proj.weight"), v("attn.c_proj.bias"), v("ln_2.weight"), v("ln_2.bias"),
                   v("mlp.c_fc.weight"), v("mlp.c_fc.bias"), v("mlp.c_proj.weight"),
                   v("mlp.c_proj.bias")});
  }
  if (stage.head) {
    p.lnfw = lay.view(flat, "ln_f.weight");
    p.lnfb = lay.view(flat, "ln_f.bias");
  }
  return p;
}

namespace buffers {

// One allocation of `bytes` (a multiple of 64) for a Carver.
Tensor allocate_bytes(gpu::Device& device, std::int64_t bytes) {
  return Tensor::empty(device, gpu::DType::kF32, {bytes / 4});
}

LayerKeep layer_keep(const ActivationOptions& o, int L, int l) {
  LayerKeep k;
  switch (o.recompute) {
    case Recompute::kNone:
      return k;
    case Recompute::kSelective:
      if (o.recomputes_scores()) k.mode = LayerKeep::Mode::kNoScores;
      return k;
    case Recompute::kFull:
      break;
  }
  const int N = o.recompute_layers;
  if (o.method == RecomputeMethod::kBlock) {
    if (l >= N) return k;
    k.mode = LayerKeep::Mode::kRecomputed;
    k.group_first = l;
    return k;
  }
  k.mode = LayerKeep::Mode::kRecomputed;
  k.group_first = l / N * N;
  k.pos = l - k.group_first;
  k.keeps_output = l == std::min(k.group_first + N, L) - 1;
  return k;
}

namespace {

// Layers of the full-recompute workspace (the largest group).
int workspace_layers(const ActivationOptions& o, int L) {
  if (o.recompute != Recompute::kFull) return 0;
  return o.method == RecomputeMethod::kBlock ? std::min(1, L) : std::min(o.recompute_layers, L);
}

struct Dims {
  std::int64_t B, T, C, Cl, NHl;
  int tp;
  bool sp;     // sequence parallel
  bool flash;  // flash attention (lse), or the reference kernel (att)
  // The LayerNorm and residual region: (B, T, C) and (B, T), or this
  // rank's B*T/tp rows of them.
  gpu::Shape rows_c() const { return sp ? gpu::Shape{B * T / tp, C} : gpu::Shape{B, T, C}; }
  gpu::Shape rows() const { return sp ? gpu::Shape{B * T / tp} : gpu::Shape{B, T}; }
};

Dims dims(const GptConfig& c, std::int64_t B, int tp, const ActivationOptions& o = {}) {
  return {B,
          c.T,
          c.C,
          c.C / tp,
          c.NH / tp,
          tp,
          o.sequence_parallel && tp > 1,
          o.attention != AttentionKernel::kReference};
}

// A layer's tensors: all of them, or without att (selective), or only the
// output.
enum class Take { kAll, kNoScores, kOutput, kNothing };

LayerActivations carve_layer(const Dims& d, Take take, Carver& k) {
  LayerActivations x;
  if (take == Take::kAll || take == Take::kNoScores) {
    const std::int64_t B = d.B, T = d.T;
    x.ln1 = k.take(d.rows_c());
    x.ln1_mean = k.take32(d.rows());
    x.ln1_rstd = k.take32(d.rows());
    x.qkv = k.take({B, T, 3 * d.Cl});
    if (d.flash) {
      x.lse = k.take32({B, d.NHl, T});
    } else if (take == Take::kAll) {
      x.att = k.take({B, d.NHl, T, T});
    }
    x.atty = k.take({B, T, d.Cl});
    x.residual2 = k.take(d.rows_c());
    x.ln2 = k.take(d.rows_c());
    x.ln2_mean = k.take32(d.rows());
    x.ln2_rstd = k.take32(d.rows());
    x.fch = k.take({B, T, 4 * d.Cl});
    x.fch_gelu = k.take({B, T, 4 * d.Cl});
  }
  if (take != Take::kNothing) x.residual3 = k.take(d.rows_c());
  return x;
}

}  // namespace

GptActivations carve_activations(const GptConfig& c, const StageSpec& stage, std::int64_t B, int tp,
                                 const ActivationOptions& o, Carver& k) {
  const Dims d = dims(c, B, tp, o);
  const std::int64_t T = c.T, Vl = c.Vp() / tp;
  const std::int64_t H = stage.head ? 1 : 0;  // the head's tensors are empty without it
  const std::int64_t P = tp > 1 ? 1 : 0;      // vocab-parallel softmax buffers
  const gpu::Shape none{0};
  GptActivations a;
  a.encoded = k.take(stage.embedding ? d.rows_c() : none);
  const int L = stage.layers();
  for (int l = 0; l < L; l++) {
    const LayerKeep keep = layer_keep(o, L, l);
    switch (keep.mode) {
      case LayerKeep::Mode::kAll:
        a.layers.push_back(carve_layer(d, Take::kAll, k));
        break;
      case LayerKeep::Mode::kNoScores:
        a.layers.push_back(carve_layer(d, Take::kNoScores, k));
        break;
      case LayerKeep::Mode::kRecomputed:
        a.layers.push_back(carve_layer(d, keep.keeps_output ? Take::kOutput : Take::kNothing, k));
        break;
    }
  }
  a.lnf = k.take(stage.head ? d.rows_c() : none);
  a.lnf_mean = k.take32(stage.head ? d.rows() : none);
  a.lnf_rstd = k.take32(stage.head ? d.rows() : none);
  a.logits = k.take({H * B, T, Vl});
  a.lse = k.take32({H * B, T});
  a.losses = k.take32({H * B, T});
  a.ce_stats = k.take32({P * H * B * T, 3});
  a.ce_gathered = k.take32({tp, P * H * B * T, 3});
  a.dresidual = k.take(d.rows_c());
  return a;
}

GptScratch carve_scratch(const GptConfig& c, const StageSpec& stage, std::int64_t B, int tp,
                         const ActivationOptions& o, Carver& k) {
  const Dims d = dims(c, B, tp, o);
  GptScratch x;
  x.btc = k.take({B, d.T, d.C});
  x.dbtc = k.take({B, d.T, d.C});
  x.datty = k.take({B, d.T, d.Cl});
  x.dqkv = k.take({B, d.T, 3 * d.Cl});
  if (d.flash) {
    x.delta = k.take32({B, d.NHl, d.T});
  } else {
    x.datt = k.take({B, d.NHl, d.T, d.T});
  }
  x.dfch = k.take({B, d.T, 4 * d.Cl});
  if (d.sp) {
    x.gathered = k.take({B, d.T, d.C});
    x.rows = k.take(d.rows_c());
    x.ln_parts = k.take32({4 * stage.layers() + (stage.head ? 2 : 0), d.C});
  }
  return x;
}

std::vector<LayerActivations> carve_workspace(const GptConfig& c, const StageSpec& stage,
                                              std::int64_t B, int tp, const ActivationOptions& o,
                                              Carver& k) {
  const Dims d = dims(c, B, tp, o);
  std::vector<LayerActivations> work;
  if (o.recomputes_scores() && stage.layers() > 0) {
    LayerActivations x;
    x.att = k.take({B, d.NHl, d.T, d.T});
    x.atty = k.take({B, d.T, d.Cl});
    work.push_back(x);
  }
  for (int p = 0; p < workspace_layers(o, stage.layers()); p++) {
    work.push_back(carve_layer(d, Take::kAll, k));
  }
  return work;
}

}  // namespace buffers

using buffers::Carver;

std::int64_t counted_slot_bytes(const GptConfig& config, const StageSpec& stage, std::int64_t B,
                                int tp, const ActivationOptions& o) {
  std::int64_t total = 0;
  Carver sizer(&total, gpu::compute_dtype(o.precision));
  carve_activations(config, stage, B, tp, o, sizer);
  return total;
}

std::int64_t counted_workspace_bytes(const GptConfig& config, const StageSpec& stage,
                                     std::int64_t B, int tp, const ActivationOptions& o) {
  std::int64_t total = 0;
  Carver sizer(&total, gpu::compute_dtype(o.precision));
  carve_workspace(config, stage, B, tp, o, sizer);
  return total;
}

std::int64_t counted_scratch_bytes(const GptConfig& config, const StageSpec& stage, std::int64_t B,
                                   int tp, const ActivationOptions& o) {
  std::int64_t total = 0;
  Carver sizer(&total, gpu::compute_dtype(o.precision));
  carve_scratch(config, stage, B, tp, o, sizer);
  return total;
}

// What Gpt::backward_input copies, in its order: per layer, last first,
// fcproj's output gradient and input, fc's, attproj's, qkv's (gathered
// with sequence parallelism).
std::int64_t counted_stash_bytes(const GptConfig& config, const StageSpec& stage, std::int64_t B,
                                 int tp, const ActivationOptions& o) {
  std::int64_t total = 0;
  Carver k(&total, gpu::compute_dtype(o.precision));
  const std::int64_t T = config.T, C = config.C, Cl = config.C / tp;
  for (int l = 0; l < stage.layers(); l++) {
    for (const std::int64_t width : {C, 4 * Cl, 4 * Cl, C, C, Cl, 3 * Cl, C}) k.take({B, T, width});
  }
  return total;
}

}  // namespace troupe::model
