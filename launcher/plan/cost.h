// The planner's cost model: seconds for what one rank of a layout does.
//
//   compute   a model chunk's forward and backward as the runtime's op list
//             (model/gpt.cc): per layer the qkv, projection, fc and fc-proj
//             GEMMs (the curve of launcher/plan/hardware.h), attention, and the
//             memory-bound ops (LayerNorm, GELU, residual, embedding,
//             cross-entropy; with --dropout, Megatron's dropout masks on
//             the attention probabilities and the two residual branches)
//             by the bytes they move; recompute adds the
//             forward (full) or the attention core (selective) to the
//             backward.
//   TP        inside every op, not overlapped (Megatron's and troupe's
//             order): 2 all-reduces of B·T·C per layer each way (with
//             sequence parallelism the same bytes as all-gather and
//             reduce-scatter), the embedding's and the head's.
//   PP        an activation or gradient of B·T·C per hop over the link
//             between the two stages' ranks (alpha-beta).
//   DP        gradient buckets reduce-scattered over the replicas as the
//             last backward of a chunk makes them final (or all after it:
//             --no-overlap-grad-reduce); then AdamW on the 1/dp partition;
//             then the parameters all-gathered. Across nodes a group gets
//             k GPUs' shares of each node's NICs, k its fewest members on
//             a node.
//
// Collectives on GPU clusters are NCCL's: the faster of ring (2(p-1)
// alpha + 2(p-1)/p n/B for an all-reduce, half of it for reduce-scatter
// or all-gather, NCCL's bus-bandwidth factors) and tree (a chain of the
// p/nodes GPUs inside each node and a tree across nodes: 2((p/nodes - 1)
// alpha_intra + log2(nodes) alpha_inter) + 2 n/B); on this-machine they are troupe's
// Communicator's: direct exchange up to 32 KiB, recursive halving-doubling for powers of two, ring
// otherwise, the sums at the measured add rate; the DP pieces go directly
// to the partitions, which add them on their stream.
#pragma once

#include <vector>

#include "actors/rank/memory_plan.h"
#include "actors/rank/rank.h"
#include "launcher/plan/hardware.h"
#include "model/config.h"
#include "model/layout.h"

namespace troupe::launcher::plan {

struct PlanInput {
  model::GptConfig model;  // as given; the vocabulary is padded for tp here
  actors::ParallelOptions parallel;
  int micro_batch = 1;
  int global_batch = 1;
  Precision precision = Precision::kBf16;
  actors::Recompute recompute = actors::Recompute::kNone;
  bool sequence_parallel = false;
  // --attention-kernel: flash keeps no scores (selective recompute then
  // recomputes nothing, and memory has no T^2 term).
  model::AttentionKernel attention = model::AttentionKernel::kFlash;
  bool ucx = false;  // this-machine: a process per rank (troupe launch), not threads
  // Megatron's attention and hidden dropout (its default 0.1; troupe's model
  // has none): a byte mask per element on the unfused core's T x T
  // probabilities and on the two residual branches, applied and read back.
  // A flash kernel fuses the attention's.
  double dropout = 0;
  // The DP reduction's buckets go as the last backward makes them final
  // (troupe, Megatron's --overlap-grad-reduce); false: all of them after
  // the stage's last op (Megatron's default before it, DeepSpeed's pipeline
  // engine).
  bool overlap_grad_reduce = true;
  // Point-to-point as Megatron's and DeepSpeed's pipelines ran it: a stage's
  // send and its next receive are posted together when its op ends; a
  // message goes once its receiver has posted the receive, and the sender
  // waits for it before its next op (batch_isend_irecv, wait, synchronize).
  // false: troupe's, which sends at once and goes on.
  bool blocking_p2p = false;
  // Megatron's scatter/gather of a pipeline message across TP ranks: each
  // sends 1/tp and the receivers all-gather it over NVLink. false: troupe's,
  // where every TP rank sends the whole activation.
  bool p2p_scatter_gather = false;

  int m() const { return parallel.micro_batches(global_batch, micro_batch); }
  int gpus() const { return parallel.world(); }
};

// One model chunk's costs on its rank.
struct ChunkCost {
  double fwd = 0, bwd = 0;        // seconds, TP collectives included
  double tp_fwd = 0, tp_bwd = 0;  // of which TP collectives
  // Of bwd, a zero-bubble schedule's W (the layers' weight-gradient GEMMs;
  // bwd - bwd_w is its B, with the stash copies), and W's pieces (a layer each).
  double bwd_w = 0;
  int w_pieces = 1;
  // Gradient buckets of the chunk's last backward: seconds into that op
  // when each is final, and its bytes (fp32, this rank's TP slice).
  struct Bucket {
    double at = 0, bytes = 0;
  };
  std::vector<Bucket> buckets;
  double owned_elements = 0;  // parameters its partitions own (all replicas together)
};

// What the simulation asks of a cost model (tests give it fixed costs).
class Costs {
 public:
  virtual ~Costs() = default;
  virtual ChunkCost chunk(const model::StageSpec& spec) const = 0;
  // One activation (or gradient) between the ranks of stages a and b, and
  // of that the receivers' own part after the bytes have come (Megatron's
  // scatter/gather: their all-gather), which a blocking sender does not
  // wait for.
  virtual double p2p_seconds(int stage_a, int stage_b) const = 0;
  virtual double p2p_gather_seconds() const { return 0; }
  // Stage `stage`'s DP group's reduction of `bytes` of gradients (as a
  // partition receives and sums them), and the parameters' return.
  virtual double dp_reduce_seconds(int stage, double bytes) const = 0;
  virtual double dp_gather_seconds(int stage, double bytes) const = 0;
  // AdamW (and the norm) over `elements` of a partition.
  virtual double optimizer_seconds(double elements) const = 0;
};

class CostModel final : public Costs {
 public:
  CostModel(const PlanInput& in, const Cluster& cluster, const Device& device);

  ChunkCost chunk(const model::StageSpec& spec) const override;
  double p2p_seconds(int stage_a, int stage_b) const override;
  double p2p_gather_seconds() const override;
  double activation_bytes() const;
  double dp_reduce_seconds(int stage, double bytes) const override;
  double dp_gather_seconds(int stage, double bytes) const override;
  double optimizer_seconds(double elements) const override;
  // A TP all-reduce of `bytes` (public for tests).
  double tp_all_reduce_seconds(double bytes) const;
  const Device& device() const { return device_; }

 private:
  int node_of(int rank) const { return rank / cluster_.gpus_per_node; }
  const Link& link(int rank_a, int rank_b) const;
  // What stage's DP group's collectives run at (made once a stage: the
  // simulation asks for every gradient bucket).
  const Link& dp_link(int stage) const;
  Link make_dp_link(int stage) const;
  // Collectives over p ranks on `nodes` nodes, `l` the slowest link:
  // all-reduce, and one of reduce-scatter / all-gather.
  double all_reduce(double bytes, int p, int nodes, const Link& l) const;
  double half_collective(double bytes, int p, const Link& l) const;
  double add_seconds(double bytes) const;  // y += x over `bytes` of y, on the compute stream
  double partition_add_seconds(double bytes) const;  // the same on the optimizer's stream

  double layer_forward(double* tp) const;
  double layer_backward(double* tp) const;
  double attention_core(bool backward) const;
  double residual_dropout(bool backward) const;  // the two residual branches' masks

  PlanInput in_;
  const Cluster& cluster_;
  Device device_;
  model::GptConfig sliced_;
  double e_;  // bytes of an activation element
  std::vector<Link> dp_links_;
};

}  // namespace troupe::launcher::plan
