// The flag table of `troupe train`, shared by train, worker, launch and
// JobConfig::from_flags: the flags registered, checked after the parse, and
// forwarded to a worker. What they resolve to: api/prepare_run.h.
#include "api/train_flags.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"

namespace troupe::api {

bool given(const CLI::Option* o) { return o != nullptr && o->count() > 0; }

bool given(const TrainFlags& f, const std::string& name) {
  for (const CLI::Option* o : f.registered) {
    if (o->count() == 0) continue;
    for (const std::string& n : o->get_lnames()) {
      if ("--" + n == name) return true;
    }
  }
  return false;
}

void add_train_flags(CLI::App* cmd, TrainFlags& f) {
  model::TrainOptions& o = f.options;
  const std::size_t before = cmd->get_options().size();
  cmd->add_option("--model", f.model,
                  "Model preset: tiny, cpu-small, gpt2-124m, gpt2-350m, "
                  "gpt3-1.3b, gpt3-175b, mt-nlg-530b")
      ->capture_default_str();
  cmd->add_option("--layers,--num-layers", f.layers, "Override L (layers)");
  cmd->add_option("--channels,--hidden-size", f.channels, "Override C (channels)");
  cmd->add_option("--heads,--num-attention-heads", f.heads, "Override NH (heads)");
  cmd->add_option("--seq-len,--seq-length", f.seq_len, "Override T (sequence length)");
  cmd->add_option("--vocab-size", f.vocab_size, "Override V (vocabulary size)");
  cmd->add_option("--make-vocab-size-divisible-by", f.vocab_multiple,
                  "Pad the vocabulary to a multiple of this (default 128)");
  cmd->add_option("--init-method-std", f.init_std,
                  "Standard deviation of the initial weights (default 0.02; residual "
                  "projections get it / sqrt(2L))");
  cmd->add_option("--recipe", f.recipe,
                  "A training recipe: mt-nlg (MT-NLG 530B's optimizer, schedule, ramp-up and "
                  "sequence length, on any model; explicit flags win)");
  cmd->add_flag("--print-config", f.print_config,
                "Print the resolved configuration (each value's source) and its memory "
                "estimate, and train nothing");
  cmd->add_option("--micro-batch-size", o.micro_batch, "Sequences per micro-batch (B)")
      ->capture_default_str();
  cmd->add_option("--global-batch-size", o.global_batch,
                  "Sequences per optimizer step (default: the micro-batch size)");
  f.steps_flag =
      cmd->add_option("--steps,--train-iters", o.steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--train-samples", o.train_samples,
                  "The run's length in samples instead of --steps (needed by "
                  "--rampup-batch-size; the learning rate then counts samples)");
  cmd->add_option("--rampup-batch-size", f.rampup,
                  "START INCREMENT SAMPLES: the global batch starts at START and grows by "
                  "INCREMENT evenly over the first SAMPLES samples to --global-batch-size")
      ->expected(3);
  cmd->add_option("--lr", o.lr.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", o.lr.min_lr, "Learning rate at the end of the decay")
      ->capture_default_str();
  f.warmup_iters_flag =
      cmd->add_option("--lr-warmup-iters", o.lr.warmup_iters, "Linear warm-up steps")
          ->capture_default_str();
  f.decay_iters_flag = cmd->add_option("--lr-decay-iters", o.lr.decay_iters,
                                       "Cosine decay ends here (default: --steps)");
  cmd->add_option("--lr-warmup-samples", o.lr.warmup_samples,
                  "With --train-samples: linear warm-up over this many samples");
  cmd->add_option("--lr-decay-samples", o.lr.decay_samples,
                  "With --train-samples: cosine decay ends after this many samples (default: "
                  "--train-samples)");
  cmd->add_option("--weight-decay", o.adam.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  cmd->add_option("--adam-beta1", o.adam.beta1, "Adam beta1")->capture_default_str();
  cmd->add_option("--adam-beta2", o.adam.beta2, "Adam beta2")->capture_default_str();
  cmd->add_option("--adam-eps", o.adam.eps, "Adam epsilon")->capture_default_str();
  cmd->add_option("--clip-grad", o.clip_grad, "Clip the global gradient norm to this (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the initialisation and the data order")
      ->capture_default_str();
  cmd->add_option("--data-path", o.data_path,
                  "Megatron indexed dataset PREFIX, or a blend WEIGHT PREFIX WEIGHT PREFIX ...; "
                  "default: a synthetic phrase corpus")
      ->expected(1, -1);
  cmd->add_option("--split", o.split, "Train,valid,test shares of the documents")
      ->capture_default_str();
  cmd->add_option("--data-cache-path", o.data_cache_path,
                  "Where sample indices are cached (default: DATA_DIR/cache)");
  cmd->add_option("--eval-interval", o.eval_interval, "Validation loss every N steps");
  cmd->add_option("--eval-iters", o.eval_iters, "Global batches per validation");
  cmd->add_flag(
      "--no-shuffle", [&o](std::int64_t) { o.shuffle = false; },
      "Samples in file order: sample i is tokens [i*T, i*T+T+1)");
  cmd->add_option("--init-weights", o.init_weights, "Start from these safetensors weights");
  cmd->add_option("--save-weights", f.save_weights, "Write the final weights here (safetensors)");
  actors::CheckpointOptions& ck = f.checkpoint;
  cmd->add_option("--save", ck.save,
                  "Checkpoint directory: DIR/iter_NNNNNNN/ after every --save-interval steps and "
                  "the last");
  cmd->add_option("--save-interval", ck.save_interval,
                  "Steps between checkpoints (default: only after the last step)");
  cmd->add_option("--keep-last", ck.keep_last,
                  "Keep only the newest K checkpoints in --save (default: all)");
  cmd->add_option("--load", ck.load,
                  "Resume from the newest checkpoint in DIR, or from DIR/iter_NNNNNNN (any "
                  "--tp/--pp/--dp/--schedule)");
  cmd->add_flag(
      "--no-load-optim,--finetune", [&ck](std::int64_t) { ck.load_optim = false; },
      "With --load: the parameters only; a new run from step 1 with fresh optimizer state");
  cmd->add_flag(
      "--exit-signal-handler", [&ck](std::int64_t) { ck.exit_signal_handler = true; },
      "On SIGTERM, save a checkpoint after the step in progress and exit cleanly");
  cmd->add_option("--exit-interval", ck.exit_interval,
                  "End the run (saving, with --save) after a step that is a multiple of this");
  cmd->add_option("--metrics-jsonl", f.metrics_jsonl, "Write one JSON object per step here");
  cmd->add_option("--log-interval", f.log_interval,
                  "A progress line every N steps (and after the last), averaged over them "
                  "(default: every step up to 100 steps, then about 100 lines a run)");
  cmd->add_option("--threads", o.threads, "Compute threads (default: all cores)");
  cmd->add_option("--device", f.device,
                  "cpu or cuda (the GPU is LOCAL_RANK's); default: cuda where this host has a "
                  "GPU (compute capability 8.0 or newer) for each of its workers, else cpu "
                  "(docs/CUDA.md). opaque: the CPU's kernels on memory the host may not read, "
                  "which tests the device path where no GPU is")
      // (Checked by check_device, not here: CLI11 reads the variable for
      // every subcommand, and a bad one must not break `troupe ckpt`.)
      ->envname("TROUPE_DEVICE")
      ->type_name("cpu|cuda|opaque");
  cmd->add_option("--recompute-granularity", f.recompute_granularity,
                  "Activation recompute: full (a group of layers keeps only its input) or "
                  "selective (the attention scores are recomputed); default none");
  cmd->add_option("--attention-kernel", f.attention_kernel,
                  "flash (tiles with an online softmax: memory linear in the sequence length) or "
                  "reference (the T x T probabilities kept); default flash, but reference with "
                  "--device cuda until scripts/gpu-check has verified the CUDA flash kernel")
      ->type_name("flash|reference");
  cmd->add_option("--recompute-method", f.recompute_method,
                  "Full recompute: uniform (groups of --recompute-num-layers layers; the default) "
                  "or block (only the first --recompute-num-layers layers of each chunk)");
  cmd->add_option(
      "--recompute-num-layers", f.recompute_layers,
      "Full recompute: layers a group (uniform) or layers recomputed (block); default 1");
  cmd->add_flag("--sequence-parallel", o.activations.sequence_parallel,
                "With --tp: split the LayerNorm and residual regions' tokens over the TP group "
                "(Korthikanti et al.); all-gathers and reduce-scatters replace its all-reduces");
  cmd->add_flag("--recompute-activations", f.recompute_activations,
                "Same as --recompute-granularity selective (Megatron's shorthand)");
  cmd->add_flag("--bf16", f.bf16,
                "Mixed precision: bf16 activations and compute, fp32 master weights, Adam state, "
                "gradients and their reduction");
  cmd->add_flag("--tf32", o.tf32,
                "CUDA: fp32 GEMMs may round their inputs to TF32 on the tensor cores (PyTorch's "
                "allow_tf32); without it they are IEEE fp32");
  cmd->add_flag("--fp16", f.fp16,
                "Mixed precision in fp16, with dynamic loss scaling: a step whose gradients "
                "overflow is skipped and the scale halved");
  model::LossScaleOptions& ls = o.loss_scale;
  f.loss_scale_flags = {
      cmd->add_option("--loss-scale", ls.constant,
                      "--fp16: a fixed loss scale instead of the dynamic one"),
      cmd->add_option("--initial-loss-scale", ls.initial, "--fp16: the dynamic scale's start")
          ->capture_default_str(),
      cmd->add_option("--min-loss-scale", ls.min, "--fp16: the dynamic scale's floor")
          ->capture_default_str(),
      cmd->add_option("--loss-scale-window", ls.window,
                      "--fp16: finite steps in a row after which the scale doubles")
          ->capture_default_str(),
      cmd->add_option("--hysteresis", ls.hysteresis,
                      "--fp16: overflows (since the last growth) before the scale halves")
          ->capture_default_str()};
  actors::ParallelOptions& par = f.parallel;
  cmd->add_option("--tp,--tensor-model-parallel-size", par.tp,
                  "Tensor-parallel ranks per stage (Megatron slicing)")
      ->capture_default_str();
  cmd->add_option("--pp,--pipeline-model-parallel-size", par.pp, "Pipeline stages")
      ->capture_default_str();
  cmd->add_option("--dp,--data-parallel-size", par.dp, "Data-parallel replicas (ZeRO-1)")
      ->capture_default_str();
  cmd->add_option("--schedule", f.schedule,
                  "Pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zbv (2 chunks per stage in "
                  "a V), zb-auto (zero-bubble: W's fill the bubbles as the run goes; zb-h1's "
                  "order, or zbv's V with --virtual-stages 2)")
      ->capture_default_str();
  cmd->add_option("--zb-max-pending-w", par.zb_max_pending_w,
                  "zb-auto: most micro-batches per model chunk whose weight gradients wait (each "
                  "holds a weight stash; default its list's: ZB-H1's s + 1 on stage s, on a V "
                  "ZB-V's per chunk)");
  cmd->add_option("--virtual-stages", par.virtual_stages,
                  "Model chunks per stage (interleaved; 2 puts zb-auto on zbv's V)")
      ->capture_default_str();
  cmd->add_option("--stall-timeout", par.stall_timeout_s,
                  "Seconds without progress after which the run is hung: it stops and says what "
                  "every rank waits for (0: never)")
      ->capture_default_str();
  cmd->add_option("--debug-fail-stage", f.fail_at,
                  "Testing: the shard of stage S throws at step K (S:K)")
      ->group("");
  cmd->add_option("--debug-stall-stage", f.stall_at,
                  "Testing: the shard of stage S never starts step K (S:K)")
      ->group("");
  actors::TraceOptions& tr = f.trace;
  cmd->add_option("--trace", tr.dir,
                  "Record every op, message and wait of every rank and write them here at the end "
                  "(also on failure and on SIGUSR1); read with `troupe trace DIR`");
  cmd->add_option("--trace-steps", f.trace_steps,
                  "Record only steps A..B (A:B, as Megatron's --profile-step-start/end)");
  cmd->add_option("--trace-buffer", f.trace_buffer,
                  "Events each rank keeps (the newest; default 262144 with --trace, 4096 without)");
  cmd->add_option("--flight-dir", tr.flight_dir,
                  "Where a failed or stalled run writes its flight recorder (default "
                  "./troupe-flight-<date>-<pid>; `troupe launch`: the run directory's flight/)");
  cmd->add_flag("--debug-trace-off", tr.off,
                "Benchmarks: record nothing, not even the flight recorder")
      ->group("");
  cmd->add_option("--debug-op-cost", f.op_cost,
                  "Testing: a chunk's forward, B and W only sleep F:B:W ms (FWD:BWD: the backward "
                  "split evenly); a comma-separated list gives one per stage")
      ->group("");
  cmd->add_option("--debug-op-jitter", f.op_jitter,
                  "Testing: each --debug-op-cost op takes its time x (1 + u X), u uniform in "
                  "[-1, 1], the same on every run")
      ->group("");
  const std::vector<CLI::Option*> all = cmd->get_options();
  f.registered.assign(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
}

absl::Status finish_train_flags(TrainFlags& f) {
  if (f.log_interval < 0) return absl::InvalidArgumentError("--log-interval must not be negative");
  if (absl::Status st = check_checkpoint_flags(f.checkpoint); !st.ok()) return st;
  absl::StatusOr<actors::ScheduleKind> kind = actors::parse_schedule(f.schedule);
  if (!kind.ok()) return kind.status();
  f.parallel.schedule = *kind;
  if (absl::Status st = actors::place_for_schedule(*kind, &f.parallel); !st.ok()) return st;
  if (!f.fail_at.empty() &&
      std::sscanf(f.fail_at.c_str(), "%d:%d", &f.parallel.fail.stage, &f.parallel.fail.step) != 2) {
    return absl::InvalidArgumentError("--debug-fail-stage " + f.fail_at + ": expected STAGE:STEP");
  }
  if (!f.stall_at.empty()) {
    f.parallel.fail.kind = actors::FailPoint::Kind::kStall;
    if (std::sscanf(f.stall_at.c_str(), "%d:%d", &f.parallel.fail.stage, &f.parallel.fail.step) !=
        2) {
      return absl::InvalidArgumentError("--debug-stall-stage " + f.stall_at +
                                        ": expected STAGE:STEP");
    }
  }
  return finish_trace_flags(f);
}

std::vector<std::string> forwarded_train_flags(const TrainFlags& f,
                                               const std::vector<std::string>& skip) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : f.registered) {
    if (opt->count() == 0) continue;
    if (opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames().front();
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    out.push_back(name);
    // A flag (--no-shuffle) takes no value: CLI11 records it as "true".
    if (opt->get_type_size_max() == 0 || opt->get_expected_max() == 0) continue;
    for (const std::string& v : opt->results()) out.push_back(v);
  }
  return out;
}

}  // namespace troupe::api
