// Memory per rank of a training layout, in two modes:
//
//   counted  what troupe allocates today (in the run's precision; no dropout
//            masks; with the reference attention kernel its B·NH·T²
//            probabilities, with flash a B·NH·T log-sum-exp), from the
//            same parameter layouts, activation slots, boundary buffers and
//            ZeRO-1 partitions RankUnit builds. RankUnit::allocated_bytes()
//            measures the same thing; tests/actors/memory_plan_test.cc holds
//            the two within 1% (the planner issue's bound is 10%).
//   paper    a Megatron-style 16-bit (bf16 or fp16) GPU run (Korthikanti et al. 2022,
//            "Reducing Activation Recomputation in Large Transformer
//            Models", section 4): bf16 parameters, fp32 gradients, fp32
//            master weights and Adam moments partitioned over dp (ZeRO-1 /
//            Megatron's distributed optimizer), and per layer the paper's
//            activation bytes with dropout, for no, selective or full
//            recompute, with or without sequence parallelism.
//
// Both count the in-flight micro-batches the schedule really holds on that
// stage (actors::peak_in_flight of make_schedule's ops), so the first 1F1B
// stage holds pp of them and the last one, and a zero-bubble schedule's
// weight stashes (what a W reads, kept from its B: actors::stashes_for).
//
//   actors::MemoryQuery q{.config = *model::preset("gpt2-124m"), .parallel = par,
//                         .micro_batch = 4, .global_batch = 64, .stage = 0};
//   absl::StatusOr<actors::MemoryParts> m = actors::counted_memory(q);
//   double gib = m->total() / (1 << 30);
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "actors/rank/rank.h"
#include "model/config.h"

namespace troupe::actors {

using model::Recompute;
using model::recompute_name;
enum class MemoryMode { kCounted, kPaper };

// `troupe plan --recompute`: "none", "selective", "full" (full: uniform,
// one layer a group); InvalidArgument naming the choices.
absl::StatusOr<Recompute> parse_recompute(const std::string& name);
std::string memory_mode_name(MemoryMode m);

struct MemoryParts {     // bytes
  double params = 0;     // the rank's parameter slices
  double grads = 0;      // their gradients
  double optimizer = 0;  // ZeRO-1: fp32 master and Adam moments (counted: and the sum, staging)
  // Kept between forward and backward for every in-flight micro-batch, and
  // the recompute workspace the backward rebuilds activations in.
  double activations = 0;
  double buffers = 0;  // boundary buffers, token buffers, other scratch
  double total() const { return params + grads + optimizer + activations + buffers; }
};

struct MemoryQuery {
  model::GptConfig config;  // the model as given (vocabulary padding applied here)
  ParallelOptions parallel;
  int micro_batch = 1;
  int global_batch = 1;
  int stage = 0;  // s; the replica and TP rank that allocate the most are counted
  Recompute recompute = Recompute::kNone;
  model::RecomputeMethod recompute_method = model::RecomputeMethod::kUniform;  // full only
  int recompute_layers = 1;                                                    // full only
  bool sequence_parallel = false;
  gpu::Precision precision = gpu::Precision::kFp32;  // --bf16/--fp16: the tensors' dtype
  model::AttentionKernel attention = model::AttentionKernel::kDefault;  // (counted as flash)
  model::ActivationOptions activations() const {
    return {.recompute = recompute,
            .method = recompute_method,
            .recompute_layers = recompute_layers,
            .sequence_parallel = sequence_parallel,
            .precision = precision,
            .attention = attention};
  }
};

// What RankUnit allocates for rank (0, stage, tp-1): the TP rank t > 0
// keeps a zero position table besides. InvalidArgument for a layout
// make_schedule refuses, or sequence parallelism without tp > 1.
absl::StatusOr<MemoryParts> counted_memory(const MemoryQuery& q);

// Korthikanti et al.'s 16-bit accounting for the same stage.
absl::StatusOr<MemoryParts> paper_memory(const MemoryQuery& q);

// Bytes of one transformer layer's activations for one micro-batch, by the
// paper's formulas (its Table 2): s b h (34 + 5 a s / h) without
// parallelism; tensor parallelism t divides the 24 + 5as/h part, sequence
// parallelism the rest too; selective recompute drops 5as/h; full keeps
// only the layer's 2sbh input (divided by t with sequence parallelism).
// With flash attention (MemoryQuery::attention) paper_memory counts a
// layer without recompute as a selective one: no 5as/h term.
// paper_memory applies full recompute's method: uniform groups of N keep
// one input a group; block keeps the inputs of its first N layers and
// everything of the rest.
double paper_layer_activation_bytes(double s, double b, double h, double a, int t,
                                    Recompute recompute, bool sequence_parallel);

absl::StatusOr<MemoryParts> memory_per_rank(MemoryMode mode, const MemoryQuery& q);

}  // namespace troupe::actors
