// `troupe train`: GPT training in this process: one rank runs the reference
// loop (model/trainer.h); --pp/--dp run every rank as actors over the
// in-process transport (actors/runtime/in_process.h). Megatron-style flags; one progress
// line per step and, with --metrics-jsonl, one JSON object per step.
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/runtime/in_process.h"
#include "api/train_flags.h"
#include "launcher/commands.h"
#include "launcher/launch_support.h"
#include "launcher/trace_signal.h"
#include "model/atomic_file.h"
#include "model/checkpoint.h"
#include "model/trainer.h"
#include "model/weights.h"

namespace troupe::launcher {
namespace {

// The single-rank loop's checkpoints: the copy on this thread, the write
// and the commit on another, one save at a time (as the actors' runtime).
class SingleRankSaver {
 public:
  SingleRankSaver(const actors::CheckpointOptions& flags, const actors::ParallelOptions& par)
      : flags_(flags), par_(par) {}
  absl::Status save(model::Trainer& t) {
    writer_.wait();
    if (!error_.ok()) return error_;
    const auto t0 = std::chrono::steady_clock::now();
    if (!snapshot_) snapshot_ = std::make_shared<model::ckpt::Snapshot>();
    absl::StatusOr<std::vector<model::ckpt::Piece>> pieces = t.checkpoint_pieces(true);
    if (!pieces.ok()) return pieces.status();
    snapshot_->retake(*pieces);  // (the last write is done with it)
    std::shared_ptr<const model::ckpt::Snapshot> snap = snapshot_;
    const double stall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    model::ckpt::Meta meta;
    meta.step = t.steps_done();
    meta.consumed_samples = t.options().batches().consumed_before(meta.step + 1);
    meta.evaluations_done = t.evaluations_done();
    meta.loss_scale = t.loss_scaler().state();
    meta.options = t.options();
    meta.schedule = actors::schedule_name(par_.schedule);
    meta.writer = model::ckpt::writer_name();
    writer_.start([this, snap, meta, stall, t0] {
      absl::StatusOr<std::string> tmp = model::ckpt::begin_save(flags_.save, meta.step);
      absl::Status st = tmp.status();
      if (st.ok()) {
        absl::StatusOr<std::vector<model::ckpt::TensorRecord>> r =
            model::ckpt::write_rank_file(*tmp, 0, snap->pieces());
        st = r.ok() ? model::ckpt::commit(flags_.save, *tmp, meta, *r, flags_.keep_last)
                    : r.status();
      }
      if (!st.ok()) {
        error_ = st;
        return;
      }
      const double total =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("saved checkpoint %s/%s (training waited %.3f s; written in %.2f s)\n",
                  flags_.save.c_str(), model::ckpt::iter_name(meta.step).c_str(), stall, total);
      std::fflush(stdout);
    });
    return absl::OkStatus();
  }
  absl::Status finish() {
    writer_.wait();
    return error_;
  }

 private:
  const actors::CheckpointOptions& flags_;
  const actors::ParallelOptions& par_;
  std::shared_ptr<model::ckpt::Snapshot> snapshot_;
  model::ckpt::BackgroundWrite writer_;
  absl::Status error_;  // the last write's (read after wait())
};

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// The activation line of the banner: what one micro-batch keeps on each
// stage between its forward and backward, as the device allocated it
// (troupe plan's counted memory predicts it), and the recompute workspace.
void print_activations(const model::TrainOptions& o, const std::vector<std::int64_t>& per_stage,
                       std::int64_t workspace) {
  std::string stages;
  for (std::size_t s = 0; s < per_stage.size(); s++) {
    absl::StrAppend(&stages, s == 0 ? "" : ", ", absl::StrFormat("%.3f", mib(per_stage[s])));
  }
  std::printf(
      "  activations per micro-batch (MiB%s, recompute %s): %s%s\n",
      per_stage.size() > 1 ? ", by stage" : "", o.activations.describe().c_str(), stages.c_str(),
      workspace > 0 ? absl::StrFormat("; recompute workspace %.2f MiB", mib(workspace)).c_str()
                    : "");
}

int run_train(TrainFlags& flags) {
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "troupe train: error: %s\n", std::string(st.message()).c_str());
    return 1;
  };
  absl::StatusOr<PreparedRun> run = prepare_run(flags, {.runner = Runner::kTrain});
  if (!run.ok()) return fail(run.status());
  if (run->printed) return 0;
  std::ofstream metrics;
  if (!flags.metrics_jsonl.empty()) {
    metrics.open(flags.metrics_jsonl, std::ios::trunc);
    if (!metrics) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--metrics-jsonl ", flags.metrics_jsonl, ": cannot open for writing")));
    }
  }
  const model::TrainOptions& o = run->options;
  const std::string& default_why = run->device_why;
  const actors::ParallelOptions& par = flags.parallel;
  const actors::CheckpointOptions& ck = flags.checkpoint;
  const model::ckpt::Checkpoint* load = run->load.has_value() ? &*run->load : nullptr;
  if (ck.exit_signal_handler) install_exit_signal_handler();
  // (--trace and --debug-op-cost need the actor runtime, even for one rank.)
  const bool one_rank = par.world() == 1 && par.virtual_stages == 1 && flags.trace.dir.empty() &&
                        flags.op_cost.empty();
  absl::StatusOr<api::RunDevice> device = api::open_device(flags);
  if (!device.ok()) return fail(device.status());
  actors::ParallelOptions on_device = par;
  on_device.device = device->device;  // (every rank of this process)
  Progress progress(o.steps, metrics.is_open() ? &metrics : nullptr, flags.log_interval);
  std::unique_ptr<model::Trainer> single;
  std::unique_ptr<actors::InProcessTrainer> multi;
  const model::data::SampleSource* train_data = nullptr;
  if (one_rank) {
    // One rank: the reference loop itself, no actors needed.
    absl::StatusOr<std::unique_ptr<model::Trainer>> t = model::Trainer::create(o, *device->device);
    if (!t.ok()) return fail(t.status());
    single = std::move(*t);
    if (load != nullptr) {
      if (absl::Status st = single->load_checkpoint(*load, ck.load_optim); !st.ok()) {
        return fail(absl::Status(st.code(), absl::StrCat("--load: ", st.message())));
      }
    }
    train_data = &single->train_data();
  } else {
    absl::StatusOr<std::unique_ptr<actors::InProcessTrainer>> t = actors::InProcessTrainer::create(
        o, on_device, stage_factory(flags),
        {.flags = ck,
         .loaded = load,
         .exit_requested = ck.exit_signal_handler ? exit_signal_received : nullptr,
         .log =
             [](const std::string& line) {
               std::printf("%s\n", line.c_str());
               std::fflush(stdout);
             }},
        flags.trace);
    if (!t.ok()) {
      absl::Status st = t.status();
      if (load != nullptr && absl::StrContains(st.message(), load->dir())) {
        st = absl::Status(st.code(), absl::StrCat("--load: ", st.message()));
      }
      return fail(st);
    }
    multi = std::move(*t);
    train_data = &multi->train_data();
  }
  // (With --tp the vocabulary is padded to a multiple of 128 x tp.)
  std::printf("troupe train: %s\n", (multi ? multi->options().model : o.model).describe().c_str());
  std::printf("  train data: %s\n", train_data->describe().c_str());
  if (!default_why.empty()) std::printf("  device: %s\n", default_why.c_str());
  const model::data::SampleSource* valid_data = single ? single->valid_data() : multi->valid_data();
  if (valid_data != nullptr) std::printf("  valid data: %s\n", valid_data->describe().c_str());
  if (one_rank) {
    std::printf("  micro-batch %d x %d accumulation = global batch %d; %d steps; 1 rank on %s\n",
                o.micro_batch, o.grad_accum(), o.global_batch, o.steps,
                device->device->name().c_str());
    print_activations(o, {single->gpt().activation_bytes_per_slot()},
                      single->gpt().recompute_workspace_bytes());
  } else {
    const int m = par.m(o);
    std::printf(
        "  %s: %d ranks as actors in this process on %s; schedule %s%s, %d micro-batches of %d "
        "per replica and step = global batch %d; %d steps\n",
        multi->layout().describe().c_str(), multi->layout().world(), device->device->name().c_str(),
        actors::schedule_name(par.schedule).c_str(),
        par.virtual_stages > 1
            ? absl::StrCat(" (", par.virtual_stages, " chunks per stage)").c_str()
            : "",
        m, o.micro_batch, o.global_batch, o.steps);
    std::printf("  optimizer state per rank (ZeRO-1): %.2f MiB of %.2f MiB for the whole model\n",
                static_cast<double>(multi->optimizer_state_bytes(0)) / (1 << 20),
                static_cast<double>(multi->unpartitioned_state_bytes()) / (1 << 20));
    // What each rank allocated (the planner's counted memory predicts it:
    // troupe plan --cluster this-machine --memory counted).
    std::string allocated;
    for (int r = 0; r < multi->layout().world() && r < 16; r++) {
      absl::StrAppend(&allocated, r == 0 ? "" : ", ",
                      absl::StrFormat("%.2f", mib(multi->allocated_bytes(r))));
    }
    std::printf("  memory allocated per rank (MiB, by rank): %s%s\n", allocated.c_str(),
                multi->layout().world() > 16 ? ", ..." : "");
    std::vector<std::int64_t> per_stage;
    std::int64_t workspace = 0;
    for (int s = 0; s < par.pp; s++) {
      const actors::RankUnit::ActivationBytes a =
          multi->activation_bytes(multi->layout().rank({.d = 0, .s = s, .t = 0}));
      per_stage.push_back(a.per_micro_batch);
      workspace = std::max(workspace, a.workspace);
    }
    print_activations(o, per_stage, workspace);
  }
  if (load != nullptr) std::printf("  %s\n", describe_load(flags, *load).c_str());
  if (progress.log_interval() > 1) {
    std::printf(
        "  a progress line every %d steps (--log-interval), averaged over them; "
        "every step in --metrics-jsonl\n",
        progress.log_interval());
  }
  const int first_step = load != nullptr && ck.load_optim ? load->meta().step + 1 : 1;
  if (load != nullptr && first_step > o.steps) {
    std::printf("  the checkpoint is at step %d: --steps %d leaves nothing to train\n",
                first_step - 1, o.steps);
  }
  std::fflush(stdout);

  if (single) {
    SingleRankSaver saver(ck, par);
    for (int i = first_step; i <= o.steps; i++) {
      model::StepMetrics m;
      if (absl::Status st = single->step(&m); !st.ok()) return fail(st);
      progress.report(m);
      const bool signal = ck.exit_signal_handler && exit_signal_received();
      const bool exiting =
          signal || (ck.exit_interval > 0 && i % ck.exit_interval == 0 && i < o.steps);
      if (!ck.save.empty() && model::ckpt::save_due(i, o.steps, ck.save_interval, exiting)) {
        if (absl::Status st = saver.save(*single); !st.ok()) return fail(st);
      }
      if (exiting) {
        progress.finish();
        std::printf("%s: ending after step %d%s\n", signal ? "exit signal" : "--exit-interval", i,
                    ck.save.empty() ? "" : " with a checkpoint");
        break;
      }
    }
    if (absl::Status st = saver.finish(); !st.ok()) return fail(st);
  } else {
    if (!flags.trace.dir.empty()) actors::remove_trace_files(flags.trace.dir);
    // SIGUSR1: every rank's trace now, into --trace DIR or the flight directory.
    DumpOnSignal usr1([&] {
      const std::string dir = flags.trace.failure_dir();
      absl::Status st = multi->write_traces(dir, "signal");
      std::fprintf(stderr, "troupe train: SIGUSR1: %s\n",
                   st.ok() ? absl::StrCat("wrote the trace to ", dir).c_str()
                           : std::string(st.message()).c_str());
    });
    absl::Status st = multi->run([&](const model::StepMetrics& m) { progress.report(m); });
    progress.finish();
    if (absl::Status written = write_trace_metrics(flags, progress); st.ok() && !written.ok()) {
      st = absl::Status(written.code(), absl::StrCat("--trace: ", written.message()));
    }
    if (!st.ok()) return fail(st);
    if (!flags.trace.dir.empty()) {
      std::printf("trace: %s (read it with `troupe trace %s`)\n", flags.trace.dir.c_str(),
                  flags.trace.dir.c_str());
    }
  }
  if (!flags.save_weights.empty()) {
    absl::Status st;
    if (single) {
      st = model::save_weights(single->gpt(), flags.save_weights);
    } else {
      // Gathered from every stage into the file one rank writes.
      model::Gpt whole(multi->options().model, 1, gpu::cpu_device());
      st = multi->gather_params(whole);
      if (st.ok()) st = model::save_weights(whole, flags.save_weights);
    }
    if (!st.ok()) return fail(st);
    std::printf("saved weights to %s\n", flags.save_weights.c_str());
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT (all ranks in this process)");
  add_train_flags(cmd, *flags);
  return [flags] { return run_train(*flags); };
}

}  // namespace troupe::launcher
