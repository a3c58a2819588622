// The single-rank step loop.
#include "model/trainer.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "gpu/ops.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace troupe::model {

absl::Status TrainOptions::validate() const {
  absl::Status st = model.validate();
  if (!st.ok()) return st;
  if (micro_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--micro-batch-size must be positive, is ", micro_batch));
  }
  if (global_batch <= 0 || global_batch % micro_batch != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch-size ", global_batch,
                     " must be a positive multiple of --micro-batch-size ", micro_batch));
  }
  if (steps < 0) return absl::InvalidArgumentError("--steps must not be negative");
  if (!(lr.lr >= 0.0f) || !(lr.min_lr >= 0.0f) || lr.min_lr > lr.lr) {
    return absl::InvalidArgumentError("--lr and --min-lr must satisfy 0 <= min-lr <= lr");
  }
  if (lr.warmup_iters < 0 || lr.decay_iters < 0) {
    return absl::InvalidArgumentError(
        "--lr-warmup-iters and --lr-decay-iters must not be negative");
  }
  if (!(adam.beta1 >= 0.0f && adam.beta1 < 1.0f) || !(adam.beta2 >= 0.0f && adam.beta2 < 1.0f)) {
    return absl::InvalidArgumentError("--adam-beta1 and --adam-beta2 must be in [0, 1)");
  }
  if (!(adam.eps > 0.0f)) return absl::InvalidArgumentError("--adam-eps must be positive");
  if (!(adam.weight_decay >= 0.0f)) {
    return absl::InvalidArgumentError("--weight-decay must not be negative");
  }
  if (st = activations.validate(); !st.ok()) return st;
  if (st = check_rampup(rampup, global_batch, micro_batch); !st.ok()) return st;
  if (st = loss_scale.validate(); !st.ok()) return st;
  if (train_samples < 0) return absl::InvalidArgumentError("--train-samples must not be negative");
  if (lr.warmup_samples < 0 || lr.decay_samples < 0) {
    return absl::InvalidArgumentError(
        "--lr-warmup-samples and --lr-decay-samples must not be negative");
  }
  if (threads < 0) return absl::InvalidArgumentError("--threads must not be negative");
  if (eval_interval < 0 || eval_iters < 0) {
    return absl::InvalidArgumentError("--eval-interval and --eval-iters must not be negative");
  }
  return absl::OkStatus();
}

float TrainOptions::lr_of_step(const BatchSchedule& b, int step) const {
  return lr_of_step(b, step, LossScaleState{});
}

float TrainOptions::lr_of_step(const BatchSchedule& b, int step,
                               const LossScaleState& skipped) const {
  return train_samples > 0 ? lr_at_samples(lr, b.consumed_before(step) - skipped.skipped_samples)
                           : lr_at(lr, step - 1 - skipped.skipped_iters);
}

absl::StatusOr<data::Datasets> build_run_datasets(const TrainOptions& options) {
  const std::int64_t gbs = options.global_batch;
  const std::int64_t train_samples =
      std::max<std::int64_t>(options.batches().consumed_before(options.steps + 1), gbs);
  std::int64_t valid_samples = 0;
  if (options.eval_interval > 0 && options.eval_iters > 0) {
    valid_samples =
        static_cast<std::int64_t>(options.steps / options.eval_interval) * options.eval_iters * gbs;
  }
  data::DataOptions d{.data_path = options.data_path,
                      .split = options.split,
                      .cache_path = options.data_cache_path,
                      .shuffle = options.shuffle,
                      .seed = options.seed,
                      .T = options.model.T,
                      .V = options.model.V};
  return data::build_datasets(d, train_samples, valid_samples);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& options) {
  absl::Status st = options.validate();
  if (!st.ok()) return st;
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  t->batches_ = options.batches();
  const GptConfig& c = options.model;
  auto datasets = build_run_datasets(options);
  if (!datasets.ok()) return datasets.status();
  t->data_ = std::move(*datasets);

  gpu::Device& dev = gpu::cpu_device();
  t->stream_ = dev.make_stream({.threads = options.threads});
  t->gpt_ = std::make_unique<Gpt>(c, options.micro_batch, dev, StageSpec::whole(c), 1,
                                  TensorParallel{}, options.activations);
  if (options.init_weights.empty()) {
    t->gpt_->init(options.seed);
  } else {
    st = load_weights(options.init_weights, *t->gpt_);
    if (!st.ok()) return st;
  }
  t->gpt_->round_params(*t->stream_);  // (mixed precision: loaded weights too)
  if (options.activations.precision != gpu::Precision::kFp32) {
    t->master_ = gpu::Tensor::empty(dev, gpu::DType::kF32, {t->gpt_->layout().total()});
    const gpu::Precision copy = gpu::Precision::kFp32;  // (round_to in fp32 copies)
    gpu::ops::round_to(*t->stream_, t->master_, t->gpt_->params(), copy);
  }
  t->scaler_ = std::make_unique<LossScaler>(options.activations.precision, options.loss_scale);
  t->adam_ = std::make_unique<AdamW>(t->gpt_->layout(), dev, *t->stream_);
  for (int j = 0; j < options.grad_accum(); j++) {
    t->tokens_.push_back(gpu::Tensor::empty(dev, gpu::DType::kI32, {options.micro_batch, c.T}));
    t->targets_.push_back(gpu::Tensor::empty(dev, gpu::DType::kI32, {options.micro_batch, c.T}));
  }
  t->norm_ = gpu::Tensor::empty(dev, gpu::DType::kF64, {1});
  st = t->stream_->synchronize();
  if (!st.ok()) return st;
  return t;
}

absl::StatusOr<std::vector<double>> Trainer::run_batch(const data::SampleSource& source,
                                                       std::int64_t first, int global_batch,
                                                       Pass pass) {
  const int B = options_.micro_batch, T = options_.model.T, m = global_batch / B;
  gpu::Stream& s = *stream_;
  gpu::Device& dev = s.device();
  // Micro-batch j is samples [first + j*B, +B) (one replica: d = 0, dp = 1).
  std::vector<std::int32_t> tok(static_cast<std::size_t>(B) * T), tgt(tok.size());
  for (int j = 0; j < m; j++) {
    absl::Status st = data::load_batch(source, data::micro_batch_first_sample(first, 0, 1, j, B), B,
                                       T, tok.data(), tgt.data());
    if (!st.ok()) return st;
    (void)dev.copy_from_host(tok.data(), tokens_[static_cast<std::size_t>(j)]);
    (void)dev.copy_from_host(tgt.data(), targets_[static_cast<std::size_t>(j)]);
  }
  // Per-micro-batch loss sums, each in token order.
  std::vector<double> loss_sums(static_cast<std::size_t>(m), 0.0);
  std::vector<float> losses_host(tok.size());
  const float dloss =
      token_loss_weight(static_cast<std::int64_t>(global_batch) * T, scaler_->scale());
  for (int j = 0; j < m; j++) {
    const gpu::Tensor& tk = tokens_[static_cast<std::size_t>(j)];
    const gpu::Tensor& tg = targets_[static_cast<std::size_t>(j)];
    gpt_->forward(s, tk, tg);
    s.host_callback([&, j] {
      if (!dev.copy_to_host(gpt_->acts().losses, losses_host.data()).ok()) return;
      double sum = 0.0;
      for (float l : losses_host) sum += l;
      loss_sums[static_cast<std::size_t>(j)] = sum;
    });
    if (pass == Pass::kForwardBackward) gpt_->backward(s, tk, tg, dloss);
  }
  absl::Status st = s.synchronize();
  if (!st.ok()) return st;
  return loss_sums;
}

absl::Status Trainer::step(StepMetrics* metrics) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const int step = steps_done_ + 1;
  const int global_batch = batches_.global_batch(step);
  const std::int64_t tokens_per_step = static_cast<std::int64_t>(global_batch) * options_.model.T;
  gpu::Stream& s = *stream_;

  gpt_->zero_grad(s);
  auto loss_sums =
      run_batch(*data_.train, batches_.consumed_before(step), global_batch, Pass::kForwardBackward);
  if (!loss_sums.ok()) return loss_sums.status();
  gpu::ops::squared_norm(s, norm_, gpt_->grads());
  absl::Status st = s.synchronize();
  if (!st.ok()) return st;
  double sq = 0.0;
  (void)s.device().copy_to_host(norm_, &sq);

  const float loss_scale = scaler_->scale();
  const float lr = options_.lr_of_step(batches_, step, scaler_->state());
  const StepDecision d = scaler_->decide(sq, options_.clip_grad, global_batch);
  if (!d.skip) {
    // Adam counts the updates made (a skipped step is not one).
    const int update = step - scaler_->state().skipped_iters;
    if (master_.defined()) {
      adam_->step(s, master_, gpt_->grads(), options_.adam, lr, update, d.grad_scale);
      gpu::ops::round_to(s, gpt_->params(), master_, options_.activations.precision);
    } else {
      adam_->step(s, gpt_->params(), gpt_->grads(), options_.adam, lr, update, d.grad_scale);
    }
  }
  st = s.synchronize();
  if (!st.ok()) return st;
  steps_done_ = step;

  double loss = 0.0;
  for (double l : *loss_sums) loss += l;  // in global micro-batch order
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  *metrics = {.step = step,
              .global_batch = global_batch,
              .consumed_samples = batches_.consumed_before(step + 1),
              .loss = loss / static_cast<double>(tokens_per_step),
              .grad_norm = d.grad_norm,
              .loss_scale = loss_scale,
              .skipped = d.skip,
              .lr = lr,
              .step_s = secs,
              .tokens_per_s = static_cast<double>(tokens_per_step) / secs,
              .val_loss = std::nullopt};
  if (data_.valid != nullptr && step % options_.eval_interval == 0) {
    auto v = validation_loss();
    if (!v.ok()) return v.status();
    metrics->val_loss = *v;
  }
  return absl::OkStatus();
}

std::vector<ckpt::Piece> Trainer::checkpoint_pieces(bool optimizer) {
  const ParamLayout& lay = gpt_->layout();
  float* params = gpt_->params().data<float>();
  float* master = master_.defined() ? master_.data<float>() : params;
  std::vector<ckpt::Piece> out;
  ckpt::add_chunk_pieces(lay, /*tied_copy=*/false, /*params=*/true, 0, optimizer ? lay.total() : 0,
                         params, master, adam_->m().data<float>(), adam_->v().data<float>(), &out);
  return out;
}

absl::Status Trainer::load_checkpoint(const ckpt::Checkpoint& c, bool optimizer) {
  for (ckpt::Piece& p : checkpoint_pieces(optimizer)) {
    // The master copy is the parameters: loaded as the master when there
    // is one, so a resume continues from the optimizer's own fp32 state.
    if (p.kind == ckpt::Kind::kMaster) continue;
    const bool master = optimizer && c.has(ckpt::Kind::kMaster);
    if (p.kind == ckpt::Kind::kParam) {
      if (master) p.kind = ckpt::Kind::kMaster;
      // Mixed precision: into the master; the parameters are it rounded.
      if (master_.defined()) {
        p.data = master_.data<float>() + (p.data - gpt_->params().data<float>());
      }
    }
    if (absl::Status st = c.fill(p); !st.ok()) return st;
  }
  if (master_.defined()) {
    const gpu::Precision precision = options_.activations.precision;
    // Parameters only (a fine-tune, or no master in the checkpoint): the
    // master starts from them rounded, as a layout's partitions do.
    if (!(optimizer && c.has(ckpt::Kind::kMaster))) {
      gpu::ops::round_to(*stream_, master_, master_, precision);
    }
    gpu::ops::round_to(*stream_, gpt_->params(), master_, precision);
    if (absl::Status st = stream_->synchronize(); !st.ok()) return st;
  }
  if (optimizer) {
    steps_done_ = c.meta().step;
    evaluations_done_ = c.meta().evaluations_done;
    if (c.meta().loss_scale) scaler_->restore(*c.meta().loss_scale);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::validation_loss() {
  if (data_.valid == nullptr) {
    return absl::FailedPreconditionError("no validation data (--eval-interval and --eval-iters)");
  }
  const std::int64_t gbs = options_.global_batch;
  double total = 0.0;
  for (int k = 0; k < options_.eval_iters; k++) {
    const std::int64_t first =
        (static_cast<std::int64_t>(evaluations_done_) * options_.eval_iters + k) * gbs;
    auto sums = run_batch(*data_.valid, first, options_.global_batch, Pass::kForwardOnly);
    if (!sums.ok()) return sums.status();
    for (double l : *sums) total += l;
  }
  evaluations_done_++;
  return total /
         (static_cast<double>(options_.eval_iters) * static_cast<double>(gbs) * options_.model.T);
}

}  // namespace troupe::model
