// `troupe train`: GPT training in this process: one rank runs the reference
// loop (model/trainer.h); --pp/--dp run every rank as actors over the
// in-process transport (actors/runtime.h). Megatron-style flags; one progress
// line per step and, with --metrics-jsonl, one JSON object per step.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actors/runtime.h"
#include "launcher/commands.h"
#include "launcher/train_flags.h"
#include "model/atomic_file.h"
#include "model/trainer.h"
#include "model/weights.h"

namespace troupe::launcher {
namespace {

int run_train(const TrainFlags& flags) {
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "troupe train: error: %s\n", std::string(st.message()).c_str());
    return 1;
  };
  absl::StatusOr<model::TrainOptions> options = resolve(flags);
  if (!options.ok()) return fail(options.status());
  if (absl::Status st = flags.parallel.validate(*options); !st.ok()) return fail(st);
  if (!flags.save_weights.empty()) {
    if (absl::Status st = check_writable(flags.save_weights, "--save-weights"); !st.ok()) {
      return fail(st);
    }
  }
  std::ofstream metrics;
  if (!flags.metrics_jsonl.empty()) {
    metrics.open(flags.metrics_jsonl, std::ios::trunc);
    if (!metrics) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--metrics-jsonl ", flags.metrics_jsonl, ": cannot open for writing")));
    }
  }
  const model::TrainOptions& o = *options;
  const actors::ParallelOptions& par = flags.parallel;
  const bool one_rank = par.world() == 1 && par.virtual_stages == 1;
  Progress progress(o.steps, metrics.is_open() ? &metrics : nullptr);
  std::unique_ptr<model::Trainer> single;
  std::unique_ptr<actors::InProcessTrainer> multi;
  const model::data::SampleSource* train_data = nullptr;
  if (one_rank) {
    // One rank: the reference loop itself, no actors needed.
    absl::StatusOr<std::unique_ptr<model::Trainer>> t = model::Trainer::create(o);
    if (!t.ok()) return fail(t.status());
    single = std::move(*t);
    train_data = &single->train_data();
  } else {
    absl::StatusOr<std::unique_ptr<actors::InProcessTrainer>> t =
        actors::InProcessTrainer::create(o, par);
    if (!t.ok()) return fail(t.status());
    multi = std::move(*t);
    train_data = &multi->train_data();
  }
  // (With --tp the vocabulary is padded to a multiple of 128 x tp.)
  std::printf("troupe train: %s\n",
              (multi ? multi->options().model : o.model).describe().c_str());
  std::printf("  train data: %s\n", train_data->describe().c_str());
  const model::data::SampleSource* valid_data =
      single ? single->valid_data() : multi->valid_data();
  if (valid_data != nullptr) std::printf("  valid data: %s\n", valid_data->describe().c_str());
  if (one_rank) {
    std::printf("  micro-batch %d x %d accumulation = global batch %d; %d steps; 1 rank\n",
                o.micro_batch, o.grad_accum(), o.global_batch, o.steps);
  } else {
    const int m = par.m(o);
    std::printf(
        "  %s: %d ranks as actors in this process; schedule %s%s, %d micro-batches of %d per "
        "replica and step = global batch %d; %d steps\n",
        multi->layout().describe().c_str(), multi->layout().world(),
        actors::schedule_name(par.schedule).c_str(),
        par.virtual_stages > 1 ? absl::StrCat(" (", par.virtual_stages, " chunks per stage)").c_str()
                               : "",
        m, o.micro_batch, o.global_batch, o.steps);
    std::printf("  optimizer state per rank (ZeRO-1): %.2f MiB of %.2f MiB for the whole model\n",
                static_cast<double>(multi->optimizer_state_bytes(0)) / (1 << 20),
                static_cast<double>(multi->unpartitioned_state_bytes()) / (1 << 20));
  }
  std::fflush(stdout);

  if (single) {
    for (int i = 0; i < o.steps; i++) {
      model::StepMetrics m;
      if (absl::Status st = single->step(&m); !st.ok()) return fail(st);
      progress.report(m);
    }
  } else {
    absl::Status st = multi->run([&](const model::StepMetrics& m) { progress.report(m); });
    if (!st.ok()) return fail(st);
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
  return [flags] {
    if (absl::Status st = finish_train_flags(*flags); !st.ok()) {
      std::fprintf(stderr, "troupe train: error: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    return run_train(*flags);
  };
}

}  // namespace troupe::launcher
