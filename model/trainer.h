// Single-rank GPT training: data, model, AdamW and the step loop on one
// stream. The actors of later issues run the same steps split across ranks;
// this loop is the reference they must agree with.
//
//   absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::create(options);
//   for (int i = 0; i < options.steps; i++) {
//     StepMetrics m;
//     RETURN_IF_ERROR((*t)->step(&m));
//   }
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/device.h"
#include "model/batch_schedule.h"
#include "model/config.h"
#include "model/data/datasets.h"
#include "model/gpt.h"
#include "model/loss_scale.h"
#include "model/optimizer.h"

namespace troupe::model {

namespace ckpt {
struct Piece;
class Checkpoint;
}  // namespace ckpt

struct TrainOptions {
  GptConfig model;
  int micro_batch = 4;   // --micro-batch-size (B)
  int global_batch = 0;  // --global-batch-size; 0 = micro_batch (with a ramp-up: the last)
  int steps = 10;
  // --train-samples: the run's length in samples (0: --steps); its steps
  // are in `steps`, and the learning rate counts samples.
  std::int64_t train_samples = 0;
  RampUp rampup;  // --rampup-batch-size START INCREMENT SAMPLES
  LrSchedule lr;
  AdamWConfig adam;
  float clip_grad = 1.0f;  // <= 0: no clipping
  // --fp16's loss scaling (model/loss_scale.h); the precision itself is
  // activations.precision (--bf16, --fp16).
  LossScaleOptions loss_scale;
  std::uint64_t seed = 1234;
  // --data-path (PREFIX, or WEIGHT PREFIX pairs; empty: the synthetic
  // phrase corpus), --split, --data-cache-path, --no-shuffle.
  std::vector<std::string> data_path;
  std::string split = "969,30,1";
  std::string data_cache_path;
  bool shuffle = true;
  int eval_interval = 0;     // --eval-interval: validation loss every N steps (0: never)
  int eval_iters = 0;        // --eval-iters: global batches per evaluation
  std::string init_weights;  // safetensors to start from; empty: initialise from seed
  int threads = 0;           // compute stream's threads; 0 = all cores
  bool tf32 = false;         // --tf32: fp32 GEMMs may use TF32 on CUDA (gpu::StreamOptions)
  // --recompute-granularity, --recompute-method, --recompute-num-layers.
  ActivationOptions activations;

  int grad_accum() const { return global_batch / micro_batch; }
  // Every step's global batch.
  BatchSchedule batches() const { return BatchSchedule(rampup, global_batch, steps); }
  // The learning rate of step `step` (1-based): by steps completed, or
  // with --train-samples by samples consumed before it.
  float lr_of_step(const BatchSchedule& batches, int step) const;
  // The same once `skipped` steps before it were skipped (--fp16): the
  // schedule counts only the steps that updated, as Megatron's.
  float lr_of_step(const BatchSchedule& batches, int step, const LossScaleState& skipped) const;
  // InvalidArgument naming the flag when options do not fit together.
  absl::Status validate() const;
};

struct StepMetrics {
  int step = 0;                       // 1-based optimizer step
  int global_batch = 0;               // sequences of this step (ramped up or --global-batch-size)
  std::int64_t consumed_samples = 0;  // after this step
  double loss = 0;                    // mean cross-entropy over all GBS*T tokens, before the update
  double grad_norm = 0;               // L2 norm of that loss's gradient, before clipping
  // --fp16: the loss scale this step's backward used, and whether its
  // gradients were not finite so it made no update (grad_norm then 0).
  float loss_scale = 1;
  bool skipped = false;
  int skipped_steps = 0;  // the run's steps skipped so far, this one too (across resumes)
  float lr = 0;
  double step_s = 0;               // wall time of this step
  double tokens_per_s = 0;         // GBS*T / step_s
  std::optional<double> val_loss;  // on steps that are a multiple of --eval-interval
};

// The train and validation samples a run of `options` reads: steps * GBS
// for training, and --eval-iters global batches at every evaluation. Used
// by this loop and by the actors' runtime alike.
absl::StatusOr<data::Datasets> build_run_datasets(const TrainOptions& options);

class Trainer {
 public:
  // On `device` (outliving the trainer): the CPU, or a GPU. Its step reads
  // nothing of the device's memory but what it copies to host tensors on
  // its stream (the losses, the gradient norm), so any device runs it.
  static absl::StatusOr<std::unique_ptr<Trainer>> create(const TrainOptions& options,
                                                         gpu::Device& device = gpu::cpu_device());

  // One optimizer step: m micro-batches forward and backward, gradient norm,
  // clipping, AdamW. Fails on bad data or a stream error.
  absl::Status step(StepMetrics* metrics);
  // Mean loss over --eval-iters global batches of the validation split;
  // evaluation e reads validation samples [e*K*GBS, (e+1)*K*GBS).
  absl::StatusOr<double> validation_loss();

  Gpt& gpt() { return *gpt_; }
  const TrainOptions& options() const { return options_; }
  gpu::Stream& stream() { return *stream_; }
  const data::SampleSource& train_data() const { return *data_.train; }
  const data::SampleSource* valid_data() const { return data_.valid.get(); }
  int steps_done() const { return steps_done_; }
  int evaluations_done() const { return evaluations_done_; }

  const LossScaler& loss_scaler() const { return *scaler_; }

  // Checkpoints (model/checkpoint.h): the state of this one rank, as the
  // pieces of its one chunk: parameters and (with `optimizer`) the fp32
  // master copy (in fp32 the parameters themselves) and Adam's m, v.
  // On a device the host cannot read (a GPU), the pieces point into host
  // copies taken here; load_checkpoint copies what it fills back.
  absl::StatusOr<std::vector<ckpt::Piece>> checkpoint_pieces(bool optimizer);
  // Parameters from `c` (any layout's); with `optimizer`, Adam's moments
  // and the step and evaluation counts too (a resume; else a fine-tune
  // that begins at step 1 with fresh moments).
  absl::Status load_checkpoint(const ckpt::Checkpoint& c, bool optimizer);

 private:
  Trainer() = default;

  TrainOptions options_;
  std::unique_ptr<gpu::Stream> stream_;
  std::unique_ptr<Gpt> gpt_;
  std::unique_ptr<AdamW> adam_;
  // Mixed precision: the fp32 master copy AdamW updates (the model's
  // bf16/fp16 parameters are it converted); undefined in fp32, where the
  // parameters are their own master.
  gpu::Tensor master_;
  std::unique_ptr<LossScaler> scaler_;
  data::Datasets data_;
  BatchSchedule batches_;
  std::vector<gpu::Tensor> tokens_, targets_;  // one (B, T) pair per micro-batch
  gpu::Tensor norm_;                           // f64[1]
  // Host tensors the stream copies to and from (gpu::ops::copy): each
  // micro-batch's tokens, targets and losses, and the norm.
  std::vector<gpu::Tensor> tokens_host_, targets_host_, losses_host_;
  gpu::Tensor norm_host_;
  // The state as checkpoints read and write it: the parameters, the master
  // (in fp32 the parameters), Adam's m and v; host copies of them where
  // the host cannot read them (staged_; the bf16/fp16 parameters widened
  // into param_values_), else the tensors themselves.
  std::array<gpu::Tensor, 4> state() const;
  std::array<gpu::Tensor, 4> staged_;
  std::vector<float> param_values_;
  absl::StatusOr<std::array<float*, 4>> state_on_host();
  absl::Status state_to_device();
  int steps_done_ = 0;
  int evaluations_done_ = 0;

  // Forward (and backward unless kForwardOnly) of the micro-batches of one
  // global batch of `global_batch` starting at sample `first`; returns the
  // loss sum per micro-batch, in micro-batch order.
  enum class Pass { kForwardOnly, kForwardBackward };
  absl::StatusOr<std::vector<double>> run_batch(const data::SampleSource& source,
                                                std::int64_t first, int global_batch, Pass pass);
};

}  // namespace troupe::model
