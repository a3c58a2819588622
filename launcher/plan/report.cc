// A planned layout and the search over layouts (see launcher/plan/report.h).
#include "launcher/plan/report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/schedule.h"

namespace troupe::launcher::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int ranks_on_node(const PlanInput& in, const Cluster& cluster) {
  return cluster.calibrated ? in.gpus() : std::min(in.gpus(), cluster.gpus_per_node);
}

}  // namespace

double model_flops(const model::GptConfig& c, int global_batch, bool full_recompute) {
  const double B = global_batch, s = c.T, l = c.L, h = c.C, V = c.Vp();
  if (full_recompute) return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

absl::Status check_layout(const PlanInput& in, const Cluster& cluster) {
  const actors::ParallelOptions& par = in.parallel;
  const model::GptConfig& c = in.model;
  for (const auto& [flag, value] :
       std::vector<std::pair<const char*, int>>{{"--tp", par.tp},
                                                {"--pp", par.pp},
                                                {"--dp", par.dp},
                                                {"--virtual-stages", par.virtual_stages},
                                                {"--micro-batch-size", in.micro_batch},
                                                {"--global-batch-size", in.global_batch}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, is ", value));
    }
  }
  if (absl::Status st = c.validate(); !st.ok()) return st;
  if (in.blocking_p2p && par.schedule == actors::ScheduleKind::kZbAuto) {
    return absl::InvalidArgumentError(
        "--blocking-p2p: not with --schedule zb-auto (its rule waits on messages as troupe sends "
        "them)");
  }
  // Sizes whose products would overflow the runtime's int arithmetic.
  if (c.L > 100000 || c.C > (1 << 20) || c.T > (1 << 20) || c.V > (1 << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model too large to plan: at most 100000 layers, 2^20 channels and sequence length, "
        "2^24 vocabulary; have --layers ",
        c.L, " --channels ", c.C, " --seq-len ", c.T, " --vocab-size ", c.V));
  }
  const std::int64_t world = static_cast<std::int64_t>(par.tp) * par.pp * par.dp;
  if (world > 32768) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp x --pp x --dp = ", world, ": troupe runs at most 32768 ranks"));
  }
  if (!cluster.calibrated && world > cluster.max_gpus()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus ", world, ": ", cluster.name, " has ", cluster.max_gpus()));
  }
  if (!cluster.calibrated && par.tp > cluster.gpus_per_node) {
    return absl::InvalidArgumentError(absl::StrCat("--tp ", par.tp, " is more than the ",
                                                   cluster.gpus_per_node,
                                                   " GPUs of a node (TP stays inside one)"));
  }
  if (!cluster.calibrated && cluster.gpus_per_node % par.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp ", par.tp, " does not divide the ", cluster.gpus_per_node,
                     " GPUs of a node: a TP group would span two nodes"));
  }
  const std::int64_t replica_batch = static_cast<std::int64_t>(in.micro_batch) * par.dp;
  if (in.global_batch % replica_batch != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global-batch-size ", in.global_batch,
        " is not a multiple of --micro-batch-size x dp = ", in.micro_batch, " x ", par.dp));
  }
  if (!(in.dropout >= 0 && in.dropout < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dropout ", in.dropout, ": a probability in [0, 1)"));
  }
  if (in.sequence_parallel && par.tp < 2) {
    return absl::InvalidArgumentError("--sequence-parallel needs --tp of at least 2");
  }
  // The runtime's own checks of the layout (the one this simulates): the
  // layer split, the schedule, at most comm::kMaxMicroBatches micro-batches
  // (the tags' 20 bits), the vocabulary slices.
  model::TrainOptions o;
  o.model = c;
  o.micro_batch = in.micro_batch;
  o.global_batch = in.global_batch;
  o.steps = 1;
  return par.validate(o);
}

absl::StatusOr<std::pair<actors::MemoryParts, int>> worst_memory(const PlanInput& in,
                                                                 actors::MemoryMode mode,
                                                                 bool all_stages) {
  std::set<int> stages{0, std::min(1, in.parallel.pp - 1), in.parallel.pp - 1};
  if (all_stages) {
    for (int s = 0; s < in.parallel.pp; s++) stages.insert(s);
  }
  std::pair<actors::MemoryParts, int> worst{{}, -1};
  // The runtime's tensors in the plan's precision (tf32 computes on fp32).
  const gpu::Precision precision = in.precision == Precision::kBf16   ? gpu::Precision::kBf16
                                   : in.precision == Precision::kFp16 ? gpu::Precision::kFp16
                                                                      : gpu::Precision::kFp32;
  for (int s : stages) {
    actors::MemoryQuery q{.config = in.model,
                          .parallel = in.parallel,
                          .micro_batch = in.micro_batch,
                          .global_batch = in.global_batch,
                          .stage = s,
                          .recompute = in.recompute,
                          .sequence_parallel = in.sequence_parallel,
                          .precision = precision,
                          .attention = in.attention};
    absl::StatusOr<actors::MemoryParts> m = actors::memory_per_rank(mode, q);
    if (!m.ok()) return m.status();
    if (worst.second < 0 || m->total() > worst.first.total()) worst = {*m, s};
  }
  return worst;
}

absl::StatusOr<Plan> make_plan(const PlanInput& in, const Cluster& cluster, actors::MemoryMode mode,
                               bool record) {
  if (absl::Status st = check_layout(in, cluster); !st.ok()) return st;
  if (mode == actors::MemoryMode::kPaper && element_bytes(in.precision) != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory paper is Korthikanti et al.'s accounting of 16-bit training: use --precision "
        "bf16 or fp16 with it, or --memory counted (not ",
        precision_name(in.precision), ")"));
  }
  absl::StatusOr<Device> device = cluster.device(ranks_on_node(in, cluster), in.precision, in.ucx);
  if (!device.ok()) return device.status();
  Plan p;
  p.in = in;
  p.cluster = cluster.name;
  p.memory_mode = mode;
  absl::StatusOr<std::pair<actors::MemoryParts, int>> mem = worst_memory(in, mode, record);
  if (!mem.ok()) return mem.status();
  p.memory = mem->first;
  p.memory_stage = mem->second;
  p.memory_capacity = device->memory_bytes;
  p.fits = p.memory.total() <= p.memory_capacity;
  const auto t0 = std::chrono::steady_clock::now();
  CostModel cost(in, cluster, *device);
  absl::StatusOr<SimResult> sim = simulate(in, cost, record);
  if (!sim.ok()) return sim.status();
  p.simulate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.sim = *std::move(sim);
  if (device->core_share > 1) {
    // More ranks than cores: they take turns, so what one rank leaves idle
    // (its bubble, its waits) another computes in. The pipeline takes the
    // longer of its schedule at full speed and every rank's compute over
    // the cores (a stage's busy time times the ranks per core); the
    // reduction, optimizer and parameters' return follow it as simulated.
    double busy = 0;
    for (double b : p.sim.busy_s) busy += b;
    const double shared = busy / static_cast<double>(p.sim.busy_s.size()) * device->core_share;
    const double longer = std::max(0.0, shared - p.sim.pipeline_s);
    p.sim.pipeline_s += longer;
    p.sim.step_s += longer;
    // The bubble is then the cores' idle share of the pipeline (0 where
    // the compute over the cores decides it); busy_s and the exposed
    // communication stay the schedule's at a rank's speed alone.
    p.sim.bubble = std::max(0.0, 1 - shared / p.sim.pipeline_s);
  }
  const model::GptConfig sliced = in.parallel.sliced_config(in.model);
  const bool full = in.recompute == actors::Recompute::kFull;
  p.tokens_per_s = static_cast<double>(in.global_batch) * sliced.T / p.sim.step_s;
  p.tflops_per_gpu = model_flops(sliced, in.global_batch, full) / p.sim.step_s / in.gpus() / 1e12;
  p.flops_formula = full ? "96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (Megatron, with full recompute)"
                         : "72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) (Megatron, no recompute)";
  p.peak_fraction = p.tflops_per_gpu * 1e12 / device->peak_flops;
  return p;
}

namespace {

// Per stage: its busy time and each chunk's forward and backward.
nlohmann::json stages_json(const SimResult& r) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t s = 0; s < r.chunks.size(); s++) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const SimResult::ChunkTimes& c : r.chunks[s]) {
      chunks.push_back({{"fwd_s", c.fwd_s},
                        {"bwd_s", c.bwd_s},
                        {"tp_fwd_s", c.tp_fwd_s},
                        {"tp_bwd_s", c.tp_bwd_s}});
    }
    out.push_back({{"stage", s}, {"busy_s", r.busy_s[s]}, {"chunks", chunks}});
  }
  return out;
}

}  // namespace

nlohmann::json plan_json(const Plan& p) {
  const actors::ParallelOptions& par = p.in.parallel;
  const actors::MemoryParts& m = p.memory;
  return {{"model", p.in.model.name},
          {"cluster", p.cluster},
          {"gpus", p.in.gpus()},
          {"tp", par.tp},
          {"pp", par.pp},
          {"dp", par.dp},
          {"micro_batch_size", p.in.micro_batch},
          {"global_batch_size", p.in.global_batch},
          {"micro_batches", p.in.m()},
          {"schedule", actors::schedule_name(par.schedule)},
          {"virtual_stages", par.virtual_stages},
          {"recompute", actors::recompute_name(p.in.recompute)},
          {"sequence_parallel", p.in.sequence_parallel},
          {"dropout", p.in.dropout},
          {"overlap_grad_reduce", p.in.overlap_grad_reduce},
          {"blocking_p2p", p.in.blocking_p2p},
          {"p2p_scatter_gather", p.in.p2p_scatter_gather},
          {"precision", precision_name(p.in.precision)},
          {"step_s", p.sim.step_s},
          {"pipeline_s", p.sim.pipeline_s},
          {"tokens_per_s", p.tokens_per_s},
          {"tflops_per_gpu", p.tflops_per_gpu},
          {"tflops_formula", p.flops_formula},
          {"peak_fraction", p.peak_fraction},
          {"bubble", p.sim.bubble},
          {"exposed_comm_s", p.sim.exposed_comm_s},
          {"exposed_comm",
           {{"stage", p.sim.exposed_stage},
            {"tp_s", p.sim.tp_comm_s},
            {"pipeline_s", p.sim.p2p_exposed_s},
            {"dp_s", p.sim.dp_exposed_s}}},
          {"optimizer_s", p.sim.optimizer_s},
          {"stages", stages_json(p.sim)},
          {"memory_gib_per_gpu", m.total() / kGiB},
          {"memory",
           {{"mode", actors::memory_mode_name(p.memory_mode)},
            {"stage", p.memory_stage},
            {"params_gib", m.params / kGiB},
            {"grads_gib", m.grads / kGiB},
            {"optimizer_gib", m.optimizer / kGiB},
            {"activations_gib", m.activations / kGiB},
            {"buffers_gib", m.buffers / kGiB},
            {"bytes", m.total()}}},
          {"memory_capacity_gib", p.memory_capacity / kGiB},
          {"fits", p.fits},
          {"simulate_s", p.simulate_s}};
}

std::string plan_text(const Plan& p) {
  const actors::ParallelOptions& par = p.in.parallel;
  const actors::MemoryParts& m = p.memory;
  std::string out = absl::StrFormat(
      "layout       tp %d x pp %d x dp %d = %d GPUs on %s, micro-batch %d, global batch %d "
      "(%d micro-batches a replica), %s%s, recompute %s%s%s, %s\n",
      par.tp, par.pp, par.dp, p.in.gpus(), p.cluster, p.in.micro_batch, p.in.global_batch, p.in.m(),
      actors::schedule_name(par.schedule),
      par.virtual_stages > 1 ? absl::StrCat(" v=", par.virtual_stages) : "",
      actors::recompute_name(p.in.recompute), p.in.sequence_parallel ? ", sequence parallel" : "",
      p.in.dropout > 0 ? absl::StrCat(", dropout ", p.in.dropout) : "",
      precision_name(p.in.precision));
  absl::StrAppendFormat(
      &out,
      "step         %.4g s (pipeline %.4g s, bubble %.1f%%; exposed communication %.3g s on "
      "stage %d: TP %.3g, pipeline %.3g, DP %.3g; optimizer %.3g s)\n",
      p.sim.step_s, p.sim.pipeline_s, 100 * p.sim.bubble, p.sim.exposed_comm_s, p.sim.exposed_stage,
      p.sim.tp_comm_s, p.sim.p2p_exposed_s, p.sim.dp_exposed_s, p.sim.optimizer_s);
  absl::StrAppendFormat(&out,
                        "throughput   %.0f tokens/s, %.4g TFLOP/s per GPU (%.1f%% of peak) by %s\n",
                        p.tokens_per_s, p.tflops_per_gpu, 100 * p.peak_fraction, p.flops_formula);
  absl::StrAppendFormat(
      &out,
      "memory       %.3g GiB per GPU of %.3g (%s), %s mode, stage %d: parameters %.3g, gradients "
      "%.3g, optimizer %.3g, activations %.3g, buffers %.3g GiB\n",
      m.total() / kGiB, p.memory_capacity / kGiB, p.fits ? "fits" : "does NOT fit",
      actors::memory_mode_name(p.memory_mode), p.memory_stage, m.params / kGiB, m.grads / kGiB,
      m.optimizer / kGiB, m.activations / kGiB, m.buffers / kGiB);
  return out;
}

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; k++) {
    if (n % k == 0) d.push_back(k);
  }
  return d;
}

}  // namespace

absl::StatusOr<SearchResult> search(const PlanInput& base, int gpus, const Cluster& cluster,
                                    actors::MemoryMode mode, bool any_recompute, int top) {
  if (gpus < 1 || gpus > 32768 || (!cluster.calibrated && gpus > cluster.max_gpus())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus ", gpus, ": ", cluster.name, " has ",
                     cluster.calibrated ? std::int64_t{32768}
                                        : std::min<std::int64_t>(cluster.max_gpus(), 32768),
                     " (troupe runs at most 32768 ranks)"));
  }
  if (base.global_batch < 1) {
    return absl::InvalidArgumentError("--global-batch-size must be positive");
  }
  if (top < 1) return absl::InvalidArgumentError(absl::StrCat("--top must be positive, is ", top));
  SearchResult r;
  std::vector<Plan> fitting;
  const model::GptConfig& c = base.model;
  std::vector<actors::Recompute> recomputes{base.recompute};
  if (any_recompute) {
    recomputes = {actors::Recompute::kNone, actors::Recompute::kSelective,
                  actors::Recompute::kFull};
  }
  for (int tp : divisors(gpus)) {
    for (int pp : divisors(gpus / tp)) {
      const int dp = gpus / (tp * pp);
      const std::string family = absl::StrCat("tp ", tp, " pp ", pp, " dp ", dp);
      if (!cluster.calibrated && cluster.gpus_per_node % tp != 0) continue;  // said once below
      if (c.NH % tp != 0) continue;
      if (c.L % pp != 0) {
        r.rejected.push_back(
            absl::StrCat(family, ": ", c.L, " layers do not split into ", pp, " stages"));
        continue;
      }
      std::string why;
      double least = INFINITY;
      bool any = false;
      for (int mb = 1; mb <= 8; mb *= 2) {
        if (base.global_batch % (mb * dp) != 0) continue;
        const int m = comm::Layout{.dp = dp}.micro_batches(base.global_batch, mb);
        std::vector<std::pair<actors::ScheduleKind, int>> schedules{
            {actors::ScheduleKind::k1F1B, 1}};
        if (pp > 1) schedules.push_back({actors::ScheduleKind::kGPipe, 1});  // one stage: the same
        for (int v = 2; v <= 8 && pp > 1; v++) {
          if (c.L % (pp * v) == 0 && m % pp == 0) {
            schedules.push_back({actors::ScheduleKind::kInterleaved1F1B, v});
          }
        }
        // The zero-bubble schedules (zb-auto is zb-h1 where stage times
        // are as modelled).
        if (pp > 1) schedules.push_back({actors::ScheduleKind::kZbH1, 1});
        if (pp > 1 && c.L % (2 * pp) == 0) schedules.push_back({actors::ScheduleKind::kZbV, 2});
        for (auto [kind, v] : schedules) {
          for (actors::Recompute rc : recomputes) {
            PlanInput in = base;
            in.parallel.tp = tp;
            in.parallel.pp = pp;
            in.parallel.dp = dp;
            in.parallel.schedule = kind;
            in.parallel.virtual_stages = v;
            if (absl::Status st = actors::place_for_schedule(kind, &in.parallel); !st.ok()) {
              why = std::string(st.message());
              continue;
            }
            in.micro_batch = mb;
            in.recompute = rc;
            in.sequence_parallel = base.sequence_parallel && tp > 1;
            if (absl::Status st = check_layout(in, cluster); !st.ok()) {
              why = std::string(st.message());
              continue;
            }
            auto mem = worst_memory(in, mode, false);
            if (!mem.ok()) {
              why = std::string(mem.status().message());
              continue;
            }
            absl::StatusOr<Device> dev =
                cluster.device(ranks_on_node(in, cluster), in.precision, in.ucx);
            if (!dev.ok()) continue;
            least = std::min(least, mem->first.total());
            if (mem->first.total() > dev->memory_bytes) continue;
            absl::StatusOr<Plan> p = make_plan(in, cluster, mode, false);
            r.simulated++;
            if (!p.ok()) continue;
            any = true;
            fitting.push_back(*std::move(p));
          }
        }
      }
      if (any) continue;
      if (std::isfinite(least)) {
        r.rejected.push_back(absl::StrFormat("%s: memory: the smallest needs %.3g GiB per GPU",
                                             family, least / kGiB));
      } else if (!why.empty()) {
        r.rejected.push_back(absl::StrCat(family, ": ", why));
      } else {
        r.rejected.push_back(absl::StrCat(family, ": global batch ", base.global_batch,
                                          " is no multiple of micro-batch x ", dp,
                                          " for micro-batches 1-8"));
      }
    }
  }
  if (!cluster.calibrated && gpus > cluster.gpus_per_node) {
    r.rejected.push_back(absl::StrCat("tp not dividing ", cluster.gpus_per_node,
                                      ": TP stays inside a node of ", cluster.gpus_per_node,
                                      " GPUs"));
  }
  r.rejected.push_back(absl::StrCat("tp not dividing the ", c.NH, " heads: not considered"));
  std::sort(fitting.begin(), fitting.end(),
            [](const Plan& a, const Plan& b) { return a.sim.step_s < b.sim.step_s; });
  if (static_cast<int>(fitting.size()) > top) fitting.resize(static_cast<std::size_t>(top));
  r.best = std::move(fitting);
  return r;
}

}  // namespace troupe::launcher::plan
