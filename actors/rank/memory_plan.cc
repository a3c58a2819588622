// Memory per rank: counted (what troupe allocates) and paper (Korthikanti et al.).
#include "actors/rank/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actors/partition.h"
#include "actors/schedule.h"
#include "model/gpt.h"
#include "model/layout.h"

namespace troupe::actors {

absl::StatusOr<Recompute> parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("--recompute '", name, "': use none, selective or full"));
}

std::string memory_mode_name(MemoryMode m) {
  return m == MemoryMode::kCounted ? "counted" : "paper";
}

namespace {

// The stage's chunks with their schedule's in-flight peaks, as RankUnit
// makes them.
struct StageChunks {
  model::GptConfig sliced;
  comm::Coord coord;
  std::vector<Chunk> chunks;   // the stage's, as its last TP rank holds them
  std::vector<int> in_flight;  // the schedule's peak per chunk
  std::vector<int> stashes;    // its weight stashes per chunk (zero-bubble schedules)
  int m = 1;
};

absl::StatusOr<StageChunks> stage_chunks(const MemoryQuery& q) {
  const ParallelOptions& par = q.parallel;
  if (q.stage < 0 || q.stage >= par.pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", q.stage, " is not in 0..", par.pp - 1));
  }
  if (q.micro_batch < 1 || q.global_batch % (q.micro_batch * par.dp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch-size ", q.global_batch, " is not a multiple of ",
                     "--micro-batch-size x dp = ", q.micro_batch * par.dp));
  }
  if (absl::Status st = check_layer_split(q.config.L, par.pp, par.virtual_stages); !st.ok()) {
    return st;
  }
  StageChunks c;
  c.sliced = par.sliced_config(q.config);
  c.coord = {.d = 0, .s = q.stage, .t = par.tp - 1};
  c.chunks = rank_chunks(c.sliced, par, c.coord);
  c.m = par.micro_batches(q.global_batch, q.micro_batch);
  absl::StatusOr<std::vector<ScheduleOp>> ops =
      make_schedule(par.schedule, par.pp, q.stage, c.m, par.virtual_stages);
  if (!ops.ok()) return ops.status();
  for (int ch = 0; ch < par.virtual_stages; ch++) {
    c.in_flight.push_back(peak_in_flight(*ops, ch));
    c.stashes.push_back(stashes_for(par, *ops, ch));
  }
  return c;
}

constexpr double kF32 = 4;

// Flash attention keeps no scores, softmax or its dropout mask: a layer
// without recompute keeps what selective recompute keeps (the paper's
// 5as/h term is gone; the per-row log-sum-exp, 4as/(h t) of sbh, is left
// out as the paper leaves out its LayerNorm statistics).
Recompute paper_mode(const MemoryQuery& q, Recompute r) {
  return q.attention != model::AttentionKernel::kReference && r == Recompute::kNone
             ? Recompute::kSelective
             : r;
}

}  // namespace

absl::StatusOr<MemoryParts> counted_memory(const MemoryQuery& q) {
  if (q.sequence_parallel && q.parallel.tp < 2) {
    return absl::InvalidArgumentError("--sequence-parallel needs --tp of at least 2");
  }
  if (absl::Status st = q.activations().validate(); !st.ok()) return st;
  absl::StatusOr<StageChunks> sc = stage_chunks(q);
  if (!sc.ok()) return sc.status();
  const ParallelOptions& par = q.parallel;
  const model::GptConfig& c = sc->sliced;
  const double B = q.micro_batch, T = c.T, C = c.C;
  const comm::Layout shape = par.layout();
  MemoryParts out;
  bool needs_data = false;
  // The compute dtype's bytes: parameters' compute copy, activations and
  // what travels between stages; master, moments and main gradients f32.
  const bool mixed = q.precision != gpu::Precision::kFp32;
  const double A = static_cast<double>(gpu::dtype_size(gpu::compute_dtype(q.precision)));
  model::ActivationOptions acts = q.activations();
  acts.precision = q.precision;
  for (std::size_t ch = 0; ch < sc->chunks.size(); ch++) {
    const model::StageSpec& spec = sc->chunks[ch].spec;
    const model::ParamLayout& layout = sc->chunks[ch].params;
    out.params += A * static_cast<double>(layout.total());
    out.grads += kF32 * static_cast<double>(layout.total());
    // Slots: the schedule's peak, one more with neighbours (RankUnit).
    const int slots = sc->in_flight[ch] + (shape.chunks() > 1 ? 1 : 0);
    out.activations += slots * static_cast<double>(
                                   model::counted_slot_bytes(c, spec, q.micro_batch, par.tp, acts));
    out.activations +=
        static_cast<double>(model::counted_workspace_bytes(c, spec, q.micro_batch, par.tp, acts));
    // Weight stashes: what a W reads, kept from its B (zero-bubble schedules).
    out.activations += sc->stashes[ch] * static_cast<double>(model::counted_stash_bytes(
                                             c, spec, q.micro_batch, par.tp, acts));
    // GptStage: input and output gradient per slot (the rows: 1/tp of
    // them with sequence parallelism).
    out.buffers += A * 2 * slots * B * T * C / (q.sequence_parallel ? par.tp : 1);
    out.buffers +=
        static_cast<double>(model::counted_scratch_bytes(c, spec, q.micro_batch, par.tp, acts));
    if (spec.embedding && sc->coord.t > 0) out.buffers += A * T * C;  // the zero wpe
    // Partition: master, m, v, the replicas' sum, and a staging window of
    // two (one at dp = 1) contributions; a norm (f64) per counted range;
    // mixed precision: the master in the compute dtype, which the shards get.
    const double n =
        std::max<double>(1, static_cast<double>(partition_range(layout, spec, par.dp, 0).size()));
    out.optimizer += kF32 * n * (4 + (par.dp > 1 ? 2 : 1)) + (mixed ? A * n : 0.0) +
                     8.0 * static_cast<double>(layout.specs().size());
    needs_data = needs_data || spec.embedding || spec.head;
  }
  if (needs_data) out.buffers += 2 * 4.0 * sc->m * B * T;  // i32 tokens and targets per micro-batch
  // Mixed precision with TP: the collectives sum in fp32 buffers of the
  // stream (actors/rank/tensor_link.cc): a (B, T, C) all-reduce, and with
  // sequence parallelism a second for the gathered side.
  if (mixed && par.tp > 1) out.buffers += kF32 * B * T * C * (q.sequence_parallel ? 2 : 1);
  return out;
}

double paper_layer_activation_bytes(double s, double b, double h, double a, int t,
                                    Recompute recompute, bool sequence_parallel) {
  const double sbh = s * b * h, tp = t;
  switch (recompute) {
    case Recompute::kFull:
      return 2 * sbh / (sequence_parallel ? tp : 1);
    case Recompute::kSelective:
      return sequence_parallel ? sbh * 34 / tp : sbh * (10 + 24 / tp);
    case Recompute::kNone:
      return sequence_parallel ? sbh * (34 + 5 * a * s / h) / tp
                               : sbh * (10 + 24 / tp + 5 * a * s / (h * tp));
  }
  return 0;
}

absl::StatusOr<MemoryParts> paper_memory(const MemoryQuery& q) {
  if (q.sequence_parallel && q.parallel.tp < 2) {
    return absl::InvalidArgumentError("--sequence-parallel needs --tp of at least 2");
  }
  absl::StatusOr<StageChunks> sc = stage_chunks(q);
  if (!sc.ok()) return sc.status();
  const ParallelOptions& par = q.parallel;
  const model::GptConfig& c = sc->sliced;
  const double s = c.T, b = q.micro_batch, h = c.C, a = c.NH, v = c.Vp();
  const double t = par.tp, sp = q.sequence_parallel ? t : 1;
  MemoryParts out;
  for (std::size_t ch = 0; ch < sc->chunks.size(); ch++) {
    const model::StageSpec& spec = sc->chunks[ch].spec;
    const model::ParamLayout& layout = sc->chunks[ch].params;
    const double n = static_cast<double>(layout.total());
    out.params += 2 * n;               // bf16 weights
    out.grads += 4 * n;                // fp32 main gradients (Megatron accumulates in fp32)
    out.optimizer += 12 * n / par.dp;  // fp32 master, Adam m and v, over dp
    const double in_flight = sc->in_flight[ch];
    auto layer = [&](Recompute r) {
      return paper_layer_activation_bytes(s, b, h, a, par.tp, paper_mode(q, r),
                                          q.sequence_parallel);
    };
    const double L = spec.layers(), N = std::min<double>(q.recompute_layers, L);
    double kept = L * layer(q.recompute);
    if (q.recompute == Recompute::kFull) {
      kept = q.recompute_method == model::RecomputeMethod::kBlock
                 ? N * layer(Recompute::kFull) + (L - N) * layer(Recompute::kNone)
                 : std::ceil(L / N) * layer(Recompute::kFull);
    }
    out.activations += in_flight * kept;
    // The paper's "other" activations: the embedding's dropout mask (one
    // byte an element) on the first stage, and on the last the final
    // LayerNorm, the output projection and the fp32 cross-entropy,
    // 4sbh/t (1 + v/h), for each micro-batch between its forward and
    // backward there (one in 1F1B, all m in GPipe).
    if (spec.embedding) out.activations += in_flight * s * b * h / sp;
    if (spec.head) out.activations += in_flight * 4 * s * b * h / t * (1 + v / h);
    // A zero-bubble schedule's weight stashes, in 16 bits: per layer each
    // linear layer's input and output gradient, 4h + 12h/t a token.
    out.activations += sc->stashes[ch] * L * s * b * h * (8 + 24 / t);
  }
  // Full recompute rebuilds one group's activations at a time in the
  // backward: a group of one micro-batch without recompute on top (one
  // layer with the block method).
  if (q.recompute == Recompute::kFull) {
    const int group = q.recompute_method == model::RecomputeMethod::kBlock ? 1 : q.recompute_layers;
    out.activations +=
        std::min(group, c.L / (par.pp * par.virtual_stages)) *
        paper_layer_activation_bytes(s, b, h, a, par.tp, paper_mode(q, Recompute::kNone),
                                     q.sequence_parallel);
  }
  // Point-to-point buffers: an activation and a gradient in 16 bits.
  if (par.pp > 1) out.buffers += 2 * 2 * s * b * h;
  return out;
}

absl::StatusOr<MemoryParts> memory_per_rank(MemoryMode mode, const MemoryQuery& q) {
  return mode == MemoryMode::kCounted ? counted_memory(q) : paper_memory(q);
}

}  // namespace troupe::actors
