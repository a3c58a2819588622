// `troupe plan`: predicts the step time, throughput and memory per GPU of a
// layout on a cluster by simulating the runtime's schedules and messages.
//   troupe plan --model mt-nlg-530b --cluster dgx-a100-80gb-selene --gpus 2240 --tp 8 --pp 35
//       --micro-batch-size 1 --global-batch-size 1920 --recompute full [--json] [--svg step.svg]
//   troupe plan ... --search                 the 10 fastest layouts of --gpus that fit
//   troupe plan calibrate --model cpu-small --micro-batch-size 4   measures this-machine
// launcher/plan/*.h say how; docs/ARCHITECTURE.md has the assumptions.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/schedule.h"
#include "launcher/commands.h"
#include "launcher/plan/calibrate.h"
#include "launcher/plan/report.h"
#include "launcher/trace/svg.h"
#include "model/atomic_file.h"

namespace troupe::launcher {
namespace {

struct PlanFlags {
  std::string model = "gpt2-124m";
  std::optional<int> layers, channels, heads, seq_len, vocab_size;
  std::string cluster;
  std::optional<int> gpus, dp;
  int tp = 1, pp = 1, virtual_stages = 1;
  int micro_batch = 1;
  std::optional<int> global_batch;
  std::string schedule = "1f1b", memory, precision, transport = "inproc";
  std::optional<std::string> attention_kernel;  // default: troupe train's on that hardware
  std::optional<std::string> recompute;         // --search tries every mode without it
  bool sequence_parallel = false, json = false, search = false;
  double dropout = 0;
  bool no_overlap_grad_reduce = false;
  bool blocking_p2p = false, p2p_scatter_gather = false;
  int top = 10;
  std::string svg;
  // calibrate
  std::vector<int> threads;
  int reps = 5;
  std::string output;
};

absl::StatusOr<model::GptConfig> model_of(const PlanFlags& f) {
  absl::StatusOr<model::GptConfig> c = model::preset(f.model);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("--model: ", c.status().message()));
  if (f.layers) c->L = *f.layers;
  if (f.channels) c->C = *f.channels;
  if (f.heads) c->NH = *f.heads;
  if (f.seq_len) c->T = *f.seq_len;
  if (f.vocab_size) c->V = *f.vocab_size;
  if (absl::Status st = c->validate(); !st.ok()) return st;
  return c;
}

// The simulated step drawn as the trace's schedule pictures are (ms).
std::string step_svg(const plan::Plan& p) {
  launcher::trace::ScheduleSvg s;
  s.title = absl::StrFormat("troupe plan: %s on %s, tp %d pp %d dp %d, %s, m=%d: %.4g s a step",
                            p.in.model.name, p.cluster, p.in.parallel.tp, p.in.parallel.pp,
                            p.in.parallel.dp, actors::schedule_name(p.in.parallel.schedule),
                            p.in.m(), p.sim.step_s);
  for (int st = 0; st < p.in.parallel.pp; st++) s.rows.push_back(absl::StrCat("stage ", st));
  s.chunks = p.in.parallel.virtual_stages;
  s.label_note = "numbers: micro-batch (1-based, as in the paper); simulated";
  for (const plan::SimOp& op : p.sim.ops) {
    s.blocks.push_back(
        {.row = op.stage,
         .begin = op.begin * 1e3,
         .end = op.end * 1e3,
         .pass = op.weight     ? trace::Pass::kWeight
                 : op.backward ? trace::Pass::kBackward
                               : trace::Pass::kForward,
         .chunk = op.chunk,
         .label = absl::StrCat(op.micro + 1),
         .tooltip = absl::StrFormat("%s mb %d chunk %d: %.3f-%.3f ms",
                                    op.weight     ? "W"
                                    : op.backward ? "backward"
                                                  : "forward",
                                    op.micro + 1, op.chunk, op.begin * 1e3, op.end * 1e3)});
  }
  for (const plan::SimMessage& m : p.sim.messages) {
    s.arrows.push_back({.from_row = m.from_stage,
                        .from = m.sent * 1e3,
                        .to_row = m.to_stage,
                        .to = m.arrived * 1e3,
                        .pass = m.backward ? trace::Pass::kBackward : trace::Pass::kForward});
  }
  return trace::render_schedule_svg(s);
}

int run_calibrate(const PlanFlags& f) {
  absl::StatusOr<model::GptConfig> c = model_of(f);
  if (!c.ok()) return command_failed("plan", c.status());
  if (f.micro_batch < 1)
    return command_failed("plan",
                          absl::InvalidArgumentError("--micro-batch-size must be positive"));
  if (f.reps < 1)
    return command_failed("plan", absl::InvalidArgumentError("--reps must be positive"));
  for (int k : f.threads) {
    if (k < 1)
      return command_failed("plan",
                            absl::InvalidArgumentError("--threads: each count must be positive"));
  }
  const std::string out = f.output.empty() ? plan::this_machine_path() : f.output;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(out).parent_path(), ec);
  if (ec) {
    return command_failed(
        "plan", absl::InvalidArgumentError(
                    absl::StrCat("--output ", out, ": cannot make its directory: ", ec.message())));
  }
  absl::StatusOr<std::string> text = plan::calibrate(
      {.model = *c, .micro_batch = f.micro_batch, .threads = f.threads, .reps = f.reps}, std::cerr);
  if (!text.ok()) return command_failed("plan", text.status());
  if (absl::Status st = model::write_file_atomically(out, *text); !st.ok()) {
    return command_failed("plan",
                          absl::InvalidArgumentError(absl::StrCat("--output ", st.message())));
  }
  std::fprintf(stderr, "troupe plan calibrate: wrote %s (use --cluster this-machine)\n",
               out.c_str());
  return 0;
}

int run_plan(const PlanFlags& f) {
  if (f.cluster.empty())
    return command_failed("plan", absl::InvalidArgumentError("--cluster is required"));
  absl::StatusOr<plan::Cluster> cluster = plan::load_cluster(f.cluster);
  if (!cluster.ok()) return command_failed("plan", cluster.status());
  absl::StatusOr<model::GptConfig> c = model_of(f);
  if (!c.ok()) return command_failed("plan", c.status());
  plan::PlanInput in;
  in.model = *c;
  in.micro_batch = f.micro_batch;
  in.parallel.tp = f.tp;
  in.parallel.pp = f.pp;
  in.parallel.virtual_stages = f.virtual_stages;
  absl::StatusOr<actors::ScheduleKind> kind = actors::parse_schedule(f.schedule);
  if (!kind.ok()) return command_failed("plan", kind.status());
  in.parallel.schedule = *kind;
  if (absl::Status st = actors::place_for_schedule(*kind, &in.parallel); !st.ok()) {
    return command_failed("plan", st);
  }
  absl::StatusOr<actors::Recompute> rc = actors::parse_recompute(f.recompute.value_or("none"));
  if (!rc.ok()) return command_failed("plan", rc.status());
  in.recompute = *rc;
  in.sequence_parallel = f.sequence_parallel;
  in.dropout = f.dropout;
  in.overlap_grad_reduce = !f.no_overlap_grad_reduce;
  in.blocking_p2p = f.blocking_p2p;
  in.p2p_scatter_gather = f.p2p_scatter_gather;
  // troupe train's default: flash on the CPU (this-machine), reference on
  // GPUs until the CUDA flash kernel has passed gpu-check.
  const std::string kernel = f.attention_kernel.value_or(
      cluster->calibrated || model::cuda_flash_verified() ? "flash" : "reference");
  absl::StatusOr<model::AttentionKernel> att = model::parse_attention_kernel(kernel);
  if (!att.ok()) return command_failed("plan", att.status());
  in.attention = *att;
  const std::string precision = !f.precision.empty()  ? f.precision
                                : cluster->calibrated ? "fp32"
                                                      : "bf16";
  absl::StatusOr<plan::Precision> prec = plan::parse_precision(precision);
  if (!prec.ok()) return command_failed("plan", prec.status());
  in.precision = *prec;
  if (f.transport != "inproc" && f.transport != "ucx") {
    return command_failed("plan", absl::InvalidArgumentError(absl::StrCat(
                                      "--transport '", f.transport,
                                      "': use inproc (troupe train) or ucx (troupe launch)")));
  }
  in.ucx = f.transport == "ucx";
  const std::string memory = !f.memory.empty()     ? f.memory
                             : cluster->calibrated ? "counted"
                                                   : "paper";
  if (memory != "counted" && memory != "paper") {
    return command_failed("plan", absl::InvalidArgumentError(absl::StrCat(
                                      "--memory '", memory, "': use counted or paper")));
  }
  const actors::MemoryMode mode =
      memory == "counted" ? actors::MemoryMode::kCounted : actors::MemoryMode::kPaper;
  // Each size on its own first (the errors name the flag given), then
  // their products in 64 bits.
  for (const auto& [flag, value] : std::vector<std::pair<const char*, std::optional<int>>>{
           {"--tp", f.tp},
           {"--pp", f.pp},
           {"--dp", f.dp},
           {"--gpus", f.gpus},
           {"--micro-batch-size", f.micro_batch},
           {"--global-batch-size", f.global_batch},
           {"--virtual-stages", f.virtual_stages},
           {"--top", f.top}}) {
    if (value && *value < 1) {
      return command_failed(
          "plan", absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, is ", *value)));
    }
  }
  const std::int64_t tp_pp = static_cast<std::int64_t>(f.tp) * f.pp;
  const std::int64_t asked = f.gpus ? *f.gpus : tp_pp * f.dp.value_or(1);
  if (asked > 32768) {
    return command_failed("plan", absl::InvalidArgumentError(absl::StrCat(
                                      f.gpus ? "--gpus " : "--tp x --pp x --dp = ", asked,
                                      ": troupe runs at most 32768 ranks")));
  }
  const int gpus = static_cast<int>(asked);
  in.global_batch = f.global_batch.value_or(f.micro_batch);

  if (f.search) {
    absl::StatusOr<plan::SearchResult> r =
        plan::search(in, gpus, *cluster, mode, /*any_recompute=*/!f.recompute.has_value(), f.top);
    if (!r.ok()) return command_failed("plan", r.status());
    if (f.json) {
      nlohmann::json j = {{"simulated", r->simulated},
                          {"rejected", r->rejected},
                          {"best", nlohmann::json::array()}};
      for (const plan::Plan& p : r->best) j["best"].push_back(plan::plan_json(p));
      std::cout << j.dump(2) << "\n";
      return r->best.empty() ? 1 : 0;
    }
    std::cout << absl::StrFormat(
        "troupe plan --search: %s on %d GPUs of %s: %d layouts simulated\n", in.model.describe(),
        gpus, cluster->name, r->simulated);
    int rank = 1;
    for (const plan::Plan& p : r->best) {
      std::cout << absl::StrFormat(
          "%2d. tp %d pp %d dp %d mb %d %s%s recompute %s: %.4g s/step, %.0f tokens/s, %.4g "
          "TFLOP/s per GPU (%s formula), bubble %.1f%%, %.3g GiB\n",
          rank++, p.in.parallel.tp, p.in.parallel.pp, p.in.parallel.dp, p.in.micro_batch,
          actors::schedule_name(p.in.parallel.schedule),
          p.in.parallel.virtual_stages > 1 ? absl::StrCat(" v=", p.in.parallel.virtual_stages) : "",
          actors::recompute_name(p.in.recompute), p.sim.step_s, p.tokens_per_s, p.tflops_per_gpu,
          p.in.recompute == actors::Recompute::kFull ? "96" : "72", 100 * p.sim.bubble,
          p.memory.total() / (1024.0 * 1024 * 1024));
    }
    std::cout << "rejected:\n";
    for (const std::string& why : r->rejected) std::cout << "  " << why << "\n";
    if (r->best.empty())
      return command_failed("plan", absl::FailedPreconditionError("no layout fits"));
    return 0;
  }

  if (f.dp) {
    in.parallel.dp = *f.dp;
    if (f.gpus && *f.gpus != tp_pp * *f.dp) {
      return command_failed(
          "plan", absl::InvalidArgumentError(absl::StrCat(
                      "--gpus ", *f.gpus, " is not --tp x --pp x --dp = ", tp_pp * *f.dp)));
    }
  } else {
    if (gpus % tp_pp != 0) {
      return command_failed("plan",
                            absl::InvalidArgumentError(absl::StrCat(
                                "--gpus ", gpus, " is not a multiple of --tp x --pp = ", tp_pp)));
    }
    in.parallel.dp = static_cast<int>(gpus / tp_pp);
  }
  if (!f.global_batch) in.global_batch = f.micro_batch * in.parallel.dp;
  absl::StatusOr<plan::Plan> p = plan::make_plan(in, *cluster, mode, !f.svg.empty());
  if (!p.ok()) return command_failed("plan", p.status());
  if (!f.svg.empty()) {
    if (absl::Status st = model::write_file_atomically(f.svg, step_svg(*p)); !st.ok()) {
      return command_failed("plan",
                            absl::InvalidArgumentError(absl::StrCat("--svg ", st.message())));
    }
  }
  if (f.json) {
    std::cout << plan::plan_json(*p).dump(2) << "\n";
  } else {
    std::cout << "troupe plan: " << in.model.describe() << "\n"
              << "cluster      " << cluster->name << ": " << cluster->description << "\n"
              << plan::plan_text(*p);
    if (!f.svg.empty()) std::cout << "wrote " << f.svg << "\n";
  }
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Predict step time, throughput and memory per GPU of a layout on a cluster");
  cmd->require_subcommand(0, 1);
  auto model_flags = [&](CLI::App* c) {
    c->add_option("--model", f->model, "Model preset")->capture_default_str();
    c->add_option("--layers,--num-layers", f->layers, "Override L");
    c->add_option("--channels,--hidden-size", f->channels, "Override C");
    c->add_option("--heads,--num-attention-heads", f->heads, "Override NH");
    c->add_option("--seq-len,--seq-length", f->seq_len, "Override T");
    c->add_option("--vocab-size", f->vocab_size, "Override V");
    c->add_option("--micro-batch-size", f->micro_batch, "Sequences per micro-batch (B)")
        ->capture_default_str();
  };
  model_flags(cmd);
  cmd->add_option("--cluster", f->cluster,
                  "dgx-a100-80gb-selene, dgx-h100, dgx-h200, this-machine, or a cluster file");
  cmd->add_option("--gpus", f->gpus, "GPUs (default: tp x pp x dp)");
  cmd->add_option("--tp", f->tp, "Tensor-parallel size")->capture_default_str();
  cmd->add_option("--pp", f->pp, "Pipeline stages")->capture_default_str();
  cmd->add_option("--dp", f->dp, "Data-parallel replicas (default: gpus / (tp x pp))");
  cmd->add_option("--global-batch-size", f->global_batch,
                  "Sequences per step (default: micro-batch x dp)");
  cmd->add_option("--schedule", f->schedule,
                  "1f1b, interleaved, gpipe, zb-h1, zbv or zb-auto (--search tries 1f1b, gpipe, "
                  "interleaved, zb-h1 and zbv)")
      ->capture_default_str();
  cmd->add_option("--virtual-stages", f->virtual_stages,
                  "Model chunks per stage (interleaved; 2 puts zb-auto on zbv's V)")
      ->capture_default_str();
  cmd->add_option("--recompute", f->recompute,
                  "Activation recompute: none (default), selective, full; --search without it "
                  "tries all three");
  cmd->add_flag("--sequence-parallel", f->sequence_parallel, "Megatron's sequence parallelism");
  cmd->add_option("--attention-kernel", f->attention_kernel,
                  "flash (no T x T scores kept; selective recompute then recomputes nothing) or "
                  "reference (the T x T probabilities kept); default: troupe train's on that "
                  "hardware (flash on this-machine, reference on GPUs until scripts/gpu-check "
                  "has verified the CUDA flash kernel)");
  cmd->add_option("--dropout", f->dropout,
                  "Megatron's attention and hidden dropout probability (its default is 0.1; "
                  "troupe's model has none): the masks' memory traffic, to predict Megatron's "
                  "runs")
      ->capture_default_str();
  cmd->add_flag("--no-overlap-grad-reduce", f->no_overlap_grad_reduce,
                "The DP reduction after a stage's last backward (Megatron before "
                "--overlap-grad-reduce, DeepSpeed's pipeline engine), not bucket by bucket "
                "during it (troupe)");
  cmd->add_flag("--blocking-p2p", f->blocking_p2p,
                "Point-to-point as Megatron's and DeepSpeed's pipelines ran it: a message goes "
                "once its receiver has posted the receive, and its sender waits for it before "
                "its next op; not troupe's, which sends and goes on");
  cmd->add_flag("--p2p-scatter-gather", f->p2p_scatter_gather,
                "A pipeline message as Megatron sends it: each TP rank sends 1/tp of the "
                "activation and the receivers all-gather it in their node; not troupe's, where "
                "every TP rank sends all of it");
  cmd->add_option("--precision", f->precision,
                  "bf16, fp16, tf32 or fp32 (default: bf16 on GPUs, fp32 on this-machine)");
  cmd->add_option("--memory", f->memory,
                  "counted (troupe's fp32 buffers) or paper (Korthikanti et al., 16-bit); default: "
                  "counted on this-machine, paper on GPUs");
  cmd->add_option("--transport", f->transport,
                  "this-machine: inproc (troupe train) or ucx (troupe launch)")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "One JSON object");
  cmd->add_flag("--search", f->search, "Rank every layout of --gpus that fits");
  cmd->add_option("--top", f->top, "Layouts --search prints")->capture_default_str();
  cmd->add_option("--svg", f->svg, "Draw the simulated step");

  CLI::App* cal =
      cmd->add_subcommand("calibrate", "Measure this machine as --cluster this-machine");
  model_flags(cal);
  cal->add_option("--threads", f->threads, "Thread counts (default: 1, 2, 4, ... and the cores)");
  cal->add_option("--reps", f->reps, "Timed runs of each kernel (the fastest counts)")
      ->capture_default_str();
  cal->add_option("--output", f->output, "Where (default: " + plan::this_machine_path() + ")");
  return [f, cal]() { return cal->parsed() ? run_calibrate(*f) : run_plan(*f); };
}

}  // namespace troupe::launcher
