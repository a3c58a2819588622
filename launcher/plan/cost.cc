// The planner's cost model (see launcher/plan/cost.h): a chunk's ops as model/gpt.cc
// runs them, collectives by their algorithms' formulas.
#include "launcher/plan/cost.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "actors/partition.h"
#include "comm/communicator.h"

namespace troupe::launcher::plan {

namespace {

bool power_of_two(int p) { return p > 0 && (p & (p - 1)) == 0; }

}  // namespace

CostModel::CostModel(const PlanInput& in, const Cluster& cluster, const Device& device)
    : in_(in),
      cluster_(cluster),
      device_(device),
      sliced_(in.parallel.sliced_config(in.model)),
      e_(element_bytes(in.precision)) {
  for (int s = 0; s < in.parallel.pp; s++) dp_links_.push_back(make_dp_link(s));
}

const Link& CostModel::link(int rank_a, int rank_b) const {
  const bool same = cluster_.calibrated || node_of(rank_a) == node_of(rank_b);
  return same ? device_.intra : device_.inter;
}

double CostModel::add_seconds(double bytes) const {
  return device_.compute.memory_seconds(3 * bytes, "axpy");
}

double CostModel::partition_add_seconds(double bytes) const {
  return device_.optimizer.memory_seconds(3 * bytes, "axpy");
}

double CostModel::all_reduce(double bytes, int p, int nodes, const Link& l) const {
  if (p <= 1) return 0;
  const double frac = static_cast<double>(p - 1) / p;
  if (cluster_.calibrated) {
    // troupe's Communicator (its default options) by messages: direct
    // exchange for small buffers (each rank sends its buffer to every other
    // and sums them all), else recursive halving-doubling (p a power of two)
    // or a ring; the sums by this rank. (Not modelled: the shared memory
    // segment that ranks all of one host's processes take instead, faster:
    // comm/shm_all_reduce.h.)
    const comm::CommunicatorOptions o;
    if (bytes <= static_cast<double>(o.direct_max_bytes)) {
      return (p - 1) * l.seconds(bytes) + add_seconds((p - 1) * bytes);
    }
    const bool halving = power_of_two(p) && bytes <= static_cast<double>(o.halving_max_bytes);
    const double steps = halving ? 2 * std::log2(p) : 2.0 * (p - 1);
    return steps * l.latency_s + 2 * frac * bytes / l.bytes_per_s + add_seconds(frac * bytes);
  }
  // NCCL: ring or tree, whichever is faster. The tree is a chain inside
  // each node and a (double binary) tree across `nodes`.
  const double ring = 2.0 * (p - 1) * l.latency_s + 2 * frac * bytes / l.bytes_per_s;
  const double per_node = static_cast<double>(p) / nodes;
  const double tree = 2 * ((per_node - 1) * device_.intra.latency_s +
                           std::log2(static_cast<double>(nodes)) * device_.inter.latency_s) +
                      2 * bytes / l.bytes_per_s;
  return std::min(ring, tree);
}

double CostModel::half_collective(double bytes, int p, const Link& l) const {
  if (p <= 1) return 0;
  const double frac = static_cast<double>(p - 1) / p;
  return (p - 1) * l.latency_s + frac * bytes / l.bytes_per_s;
}

double CostModel::tp_all_reduce_seconds(double bytes) const {
  const int tp = in_.parallel.tp;
  return all_reduce(bytes, tp, /*nodes=*/1, link(0, tp - 1));  // TP stays in a node
}

double CostModel::attention_core(bool backward) const {
  const Compute& k = device_.compute;
  const double B = in_.micro_batch, T = sliced_.T, HS = sliced_.HS();
  const double heads = B * sliced_.NH / in_.parallel.tp;  // this rank's (micro-batch x head) pairs
  // q.k^T and att.v, full T x T (a causal kernel may skip half; the rate
  // is measured against this count).
  const double flops = heads * 4 * T * T * HS * (backward ? 2 : 1);
  if (k.fused_attention) {
    const bool flash = in_.attention != model::AttentionKernel::kReference;
    const double rate =
        flash ? (backward ? k.attention_bwd_flops : k.attention_fwd_flops)
              : (backward ? k.reference_attention_bwd_flops : k.reference_attention_fwd_flops);
    return flops / rate * k.slowdown;
  }
  // Megatron's (unfused) core: batched GEMMs and a fused scale-mask-softmax.
  const GemmPass pass = backward ? GemmPass::kBackward : GemmPass::kForward;
  // Each a batched kernel over the heads (Megatron's baddbmm and bmm).
  const double gemms =
      k.gemm_seconds(T, T, HS, pass, heads) + k.gemm_seconds(T, HS, T, pass, heads);
  const double softmax = k.memory_seconds((backward ? 3 : 2) * e_ * heads * T * T, "softmax");
  // Dropout on the probabilities (a flash kernel fuses it): reads them and
  // writes them and the mask (forward); reads the gradient and the mask and
  // writes the gradient.
  const bool masked = in_.dropout > 0 && in_.attention == model::AttentionKernel::kReference;
  const double dropout = masked ? k.memory_seconds((2 * e_ + 1) * heads * T * T, "dropout") : 0;
  return gemms + softmax + dropout;
}

double CostModel::residual_dropout(bool backward) const {
  if (in_.dropout <= 0) return 0;
  const double N = static_cast<double>(in_.micro_batch) * sliced_.T, C = sliced_.C;
  const double sp = in_.sequence_parallel ? in_.parallel.tp : 1;
  // Fused with the bias and the residual add (counted there): the mask's
  // byte written, or read with the gradient it scales (read and written).
  const double bytes = backward ? (2 * e_ + 1) * N * C : N * C;
  return 2 * device_.compute.memory_seconds(bytes / sp, "dropout", /*own_kernel=*/false);
}

double CostModel::layer_forward(double* tp) const {
  const Compute& k = device_.compute;
  const double N = static_cast<double>(in_.micro_batch) * sliced_.T, C = sliced_.C;
  const double t = in_.parallel.tp, F = 4 * C / t;
  const double sp = in_.sequence_parallel ? t : 1;  // LayerNorm and residual rows split
  const GemmPass fwd = GemmPass::kForward;
  const double ln = k.memory_seconds((2 * N * C * e_ + 8 * N) / sp, "layernorm_fwd");
  const double residual = k.memory_seconds(3 * N * C * e_ / sp, "residual");
  const double ar = tp_all_reduce_seconds(N * C * e_);
  *tp += 2 * ar;
  return 2 * ln + 2 * residual + 2 * ar + residual_dropout(false)        //
         + k.gemm_seconds(N, 3 * C / t, C, fwd) + attention_core(false)  //
         + k.gemm_seconds(N, C, C / t, fwd)                              //
         + k.gemm_seconds(N, F, C, fwd) + k.memory_seconds(2 * N * F * e_, "gelu_fwd") +
         k.gemm_seconds(N, C, F, fwd);
}

double CostModel::layer_backward(double* tp) const {
  const Compute& k = device_.compute;
  const double N = static_cast<double>(in_.micro_batch) * sliced_.T, C = sliced_.C;
  const double t = in_.parallel.tp, F = 4 * C / t;
  const double sp = in_.sequence_parallel ? t : 1;
  const GemmPass bwd = GemmPass::kBackward;
  const double ln = k.memory_seconds((4 * N * C * e_ + 8 * N) / sp, "layernorm_bwd");
  const double ar = tp_all_reduce_seconds(N * C * e_);
  *tp += 2 * ar;
  // The residual stream's gradient takes each branch's input gradient:
  // two adds (read two, write one).
  const double residual = k.memory_seconds(3 * N * C * e_ / sp, "residual");
  double s = 2 * ln + 2 * ar + 2 * residual + residual_dropout(true)  //
             + k.gemm_seconds(N, C, F, bwd) + k.memory_seconds(3 * N * F * e_, "gelu_bwd") +
             k.gemm_seconds(N, F, C, bwd)  //
             + k.gemm_seconds(N, C, C / t, bwd) + attention_core(true) +
             k.gemm_seconds(N, 3 * C / t, C, bwd);
  switch (in_.recompute) {
    case actors::Recompute::kFull:
      s += layer_forward(tp);
      break;
    case actors::Recompute::kSelective:
      if (in_.attention == model::AttentionKernel::kReference) s += attention_core(false);
      break;
    case actors::Recompute::kNone:
      break;
  }
  return s;
}

ChunkCost CostModel::chunk(const model::StageSpec& spec) const {
  const Compute& k = device_.compute;
  const actors::ParallelOptions& par = in_.parallel;
  const double N = static_cast<double>(in_.micro_batch) * sliced_.T, C = sliced_.C;
  const double Vl = static_cast<double>(sliced_.Vp()) / par.tp;
  ChunkCost c;
  double tp_f = 0, tp_b = 0;
  const double layer_f = layer_forward(&tp_f);
  double layer_b = layer_backward(&tp_b);
  if (actors::splits_backward(par.schedule)) {
    // B copies each linear layer's input and output gradient into the
    // weight stash (4C + 12C/t a token); W runs the weight GEMMs.
    const double t = par.tp, F = 4 * C / t;
    const double w = k.weight_grad_seconds(N, C, F) + k.weight_grad_seconds(N, F, C) +
                     k.weight_grad_seconds(N, C, C / t) + k.weight_grad_seconds(N, 3 * C / t, C);
    // (Eight copies: each linear layer's input and output gradient.)
    layer_b += 8 * k.memory_seconds(2 * N * (4 * C + 12 * C / t) * e_ / 8, "copy");
    c.bwd_w = spec.layers() * w;
    c.w_pieces = std::max(1, spec.layers());
  }
  c.fwd = spec.layers() * layer_f;
  c.tp_fwd = spec.layers() * tp_f;
  c.tp_bwd = spec.layers() * tp_b;
  const double ar = tp_all_reduce_seconds(N * C * e_);
  double head_b = 0, emb_b = 0;
  if (spec.embedding) {
    c.fwd += k.memory_seconds(3 * N * C * e_, "embedding_fwd") + ar;
    c.tp_fwd += ar;
    emb_b = k.memory_seconds(4 * N * C * e_, "embedding_bwd");
  }
  if (spec.head) {
    const double gather =
        par.tp > 1 ? half_collective(12 * N * par.tp, par.tp, link(0, par.tp - 1)) : 0;
    c.fwd +=
        k.memory_seconds(2 * N * C * e_ + 8 * N, "layernorm_fwd") +
        k.gemm_seconds(N, Vl, C, GemmPass::kForward) +
        k.memory_seconds(N * Vl * e_, par.tp > 1 ? "crossentropy_partial" : "crossentropy_fwd") +
        gather;
    c.tp_fwd += gather;
    head_b = k.memory_seconds(N * C * e_, "fill") +
             k.memory_seconds(2 * N * Vl * e_, "crossentropy_bwd") +
             k.gemm_seconds(N, Vl, C, GemmPass::kBackward) + ar +
             k.memory_seconds(4 * N * C * e_ + 8 * N, "layernorm_bwd");
    c.tp_bwd += ar;
  } else {
    head_b = k.memory_seconds(N * C * e_, "fill") + k.memory_seconds(3 * N * C * e_, "axpy");
  }
  c.bwd = head_b + spec.layers() * layer_b + emb_b;
  // The runtime's gradient buckets (actors::grad_buckets), final as the
  // last backward passes the head, each layer (last first), the embedding;
  // fp32, as Megatron reduces them.
  const model::ParamLayout layout = model::ParamLayout::gpt(sliced_, spec, {par.tp, par.tp - 1});
  for (const actors::GradBucket& b : actors::grad_buckets(layout, spec)) {
    double at = c.bwd;
    if (b.ready.part == model::GradPoint::Part::kHead) at = head_b;
    if (b.ready.part == model::GradPoint::Part::kLayer) {
      at = head_b + (spec.last_layer - b.ready.layer) * layer_b;
    }
    c.buckets.push_back({at, 4.0 * static_cast<double>(b.range.size())});
  }
  std::sort(c.buckets.begin(), c.buckets.end(),
            [](const ChunkCost::Bucket& a, const ChunkCost::Bucket& b) { return a.at < b.at; });
  c.owned_elements = static_cast<double>(actors::owned_region(layout, spec).size());
  return c;
}

double CostModel::activation_bytes() const {
  return static_cast<double>(in_.micro_batch) * sliced_.T * sliced_.C * e_;
}

double CostModel::p2p_seconds(int stage_a, int stage_b) const {
  const int per_stage = in_.parallel.dp * in_.parallel.tp, tp = in_.parallel.tp;
  const Link& l = link(stage_a * per_stage, stage_b * per_stage);
  const double bytes = activation_bytes();
  if (!in_.p2p_scatter_gather || tp == 1) return l.seconds(bytes);
  // Megatron's scatter/gather (Narayanan et al. 2021, section 4.1): each TP
  // rank sends its 1/tp of the activation, and the receivers all-gather it
  // inside the node (with sequence parallelism the activation is already
  // split, and nothing is gathered).
  return l.seconds(bytes / tp) + p2p_gather_seconds();
}

double CostModel::p2p_gather_seconds() const {
  const int tp = in_.parallel.tp;
  if (!in_.p2p_scatter_gather || tp == 1 || in_.sequence_parallel) return 0;
  return half_collective(activation_bytes(), tp, link(0, tp - 1));
}

Link CostModel::make_dp_link(int stage) const {
  const int dp = in_.parallel.dp, tp = in_.parallel.tp;
  const int first = stage * dp * tp;  // the group of (stage, t = 0): first + d tp
  Link l = link(first, first + (dp - 1) * tp);
  if (cluster_.calibrated || node_of(first) == node_of(first + (dp - 1) * tp)) return l;
  // Across nodes NCCL runs a ring per channel, each through its own NIC, so
  // a node with k of the group's members gives it k GPUs' shares of its
  // NICs (its other GPUs, in other groups, reduce at the same time through
  // the rest), up to what NVLink carries inside the node; the ring runs at
  // the pace of the node with the fewest.
  std::map<int, int> members;
  for (int d = 0; d < dp; d++) members[node_of(first + d * tp)]++;
  int k = dp;
  for (const auto& [node, n] : members) k = std::min(k, n);
  l.bytes_per_s = std::min(k * l.bytes_per_s, device_.intra.bytes_per_s);
  return l;
}

const Link& CostModel::dp_link(int stage) const {
  return dp_links_[static_cast<std::size_t>(stage)];
}

double CostModel::dp_reduce_seconds(int stage, double bytes) const {
  const int dp = in_.parallel.dp;
  const Link& l = dp_link(stage);
  if (cluster_.calibrated) {
    // Each replica sends every partition its piece; the partition adds the
    // dp contributions on its stream.
    const double frac = static_cast<double>(dp - 1) / dp;
    const double send = dp > 1 ? (dp - 1) * l.latency_s + frac * bytes / l.bytes_per_s
                               : device_.intra.seconds(bytes);  // to its own partition
    return send + partition_add_seconds(bytes);
  }
  return half_collective(bytes, dp, l);  // NCCL reduce-scatter
}

double CostModel::dp_gather_seconds(int stage, double bytes) const {
  const int dp = in_.parallel.dp;
  const Link& l = dp_link(stage);
  if (cluster_.calibrated && dp == 1) return device_.intra.seconds(bytes);
  return half_collective(bytes, dp, l);
}

double CostModel::optimizer_seconds(double elements) const {
  // AdamW reads the master copy, the gradient and both moments and writes
  // three of them (fp32); the norm reads the gradient once more.
  return device_.optimizer.memory_seconds(28 * elements, "adamw") +
         device_.optimizer.memory_seconds(4 * elements, "norm");
}

}  // namespace troupe::launcher::plan
