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

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& options,
                                                         gpu::Device& dev) {
  absl::Status st = options.validate();
  if (!st.ok()) return st;
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  t->batches_ = options.batches();
  const GptConfig& c = options.model;
  auto datasets = build_run_datasets(options);
  if (!datasets.ok()) return datasets.status();
  t->data_ = std::move(*datasets);

  t->stream_ = dev.make_stream({.threads = options.threads, .tf32 = options.tf32});
  t->gpt_ = std::make_unique<Gpt>(c, options.micro_batch, dev, StageSpec::whole(c), 1,
                                  TensorParallel{}, options.activations);
  if (options.init_weights.empty()) {
    st = t->gpt_->init(options.seed);
  } else {
    st = load_weights(options.init_weights, *t->gpt_);
  }
  if (!st.ok()) return st;
  if (options.activations.precision != gpu::Precision::kFp32) {
    // The master starts from the bf16/fp16 parameters, widened (exact).
    t->master_ = gpu::Tensor::empty(dev, gpu::DType::kF32, {t->gpt_->layout().total()});
    gpu::ops::convert(*t->stream_, t->master_, t->gpt_->params());
  }
  t->scaler_ = std::make_unique<LossScaler>(options.activations.precision, options.loss_scale);
  t->adam_ = std::make_unique<AdamW>(t->gpt_->layout(), dev, *t->stream_);
  const gpu::Shape bt = {options.micro_batch, c.T};
  for (int j = 0; j < options.grad_accum(); j++) {
    t->tokens_.push_back(gpu::Tensor::empty(dev, gpu::DType::kI32, bt));
    t->targets_.push_back(gpu::Tensor::empty(dev, gpu::DType::kI32, bt));
    t->tokens_host_.push_back(gpu::Tensor::empty_host(dev, gpu::DType::kI32, bt));
    t->targets_host_.push_back(gpu::Tensor::empty_host(dev, gpu::DType::kI32, bt));
    t->losses_host_.push_back(gpu::Tensor::empty_host(dev, gpu::DType::kF32, bt));
  }
  t->norm_ = gpu::Tensor::empty(dev, gpu::DType::kF64, {1});
  t->norm_host_ = gpu::Tensor::empty_host(dev, gpu::DType::kF64, {1});
  st = t->stream_->synchronize();
  if (!st.ok()) return st;
  return t;
}

absl::StatusOr<std::vector<double>> Trainer::run_batch(const data::SampleSource& source,
                                                       std::int64_t first, int global_batch,
                                                       Pass pass) {
  const int B = options_.micro_batch, T = options_.model.T, m = global_batch / B;
  gpu::Stream& s = *stream_;
  // Micro-batch j is samples [first + j*B, +B) (one replica: d = 0, dp = 1),
  // read into its host tensors (the last step's copies from them are done:
  // it ended in a synchronize) and copied to the device in stream order.
  // Every micro-batch is read before any copy is queued: a bad sample
  // returns with no copy pending from the host tensors.
  for (int j = 0; j < m; j++) {
    const auto k = static_cast<std::size_t>(j);
    absl::Status st = data::load_batch(source, data::micro_batch_first_sample(first, 0, 1, j, B), B,
                                       T, tokens_host_[k].host<std::int32_t>(),
                                       targets_host_[k].host<std::int32_t>());
    if (!st.ok()) return st;
  }
  for (int j = 0; j < m; j++) {
    const auto k = static_cast<std::size_t>(j);
    gpu::ops::copy(s, tokens_[k], tokens_host_[k]);
    gpu::ops::copy(s, targets_[k], targets_host_[k]);
  }
  const float dloss =
      token_loss_weight(static_cast<std::int64_t>(global_batch) * T, scaler_->scale());
  for (int j = 0; j < m; j++) {
    const auto k = static_cast<std::size_t>(j);
    gpt_->forward(s, tokens_[k], targets_[k]);
    gpu::ops::copy(s, losses_host_[k], gpt_->acts().losses);  // before the next forward's
    if (pass == Pass::kForwardBackward) gpt_->backward(s, tokens_[k], targets_[k], dloss);
  }
  absl::Status st = s.synchronize();
  if (!st.ok()) return st;
  // Per-micro-batch loss sums, each in token order.
  std::vector<double> loss_sums(static_cast<std::size_t>(m), 0.0);
  for (int j = 0; j < m; j++) {
    const gpu::Tensor& l = losses_host_[static_cast<std::size_t>(j)];
    const float* p = l.host<float>();
    double sum = 0.0;
    for (std::int64_t i = 0; i < l.numel(); i++) sum += p[i];
    loss_sums[static_cast<std::size_t>(j)] = sum;
  }
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
  gpu::ops::copy(s, norm_host_, norm_);
  absl::Status st = s.synchronize();
  if (!st.ok()) return st;
  const double sq = norm_host_.host<double>()[0];

  const float loss_scale = scaler_->scale();
  const float lr = options_.lr_of_step(batches_, step, scaler_->state());
  const StepDecision d = scaler_->decide(sq, options_.clip_grad, global_batch);
  if (!d.skip) {
    // Adam counts the updates made (a skipped step is not one).
    const int update = step - scaler_->state().skipped_iters;
    if (master_.defined()) {
      // (and the compute copy, rounded from the updated master in the same pass)
      adam_->step(s, master_, gpt_->grads(), options_.adam, lr, update, d.grad_scale,
                  gpt_->params());
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
              .skipped_steps = scaler_->state().skipped_iters,
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

std::array<gpu::Tensor, 4> Trainer::state() const {
  return {gpt_->params(), master_.defined() ? master_ : gpt_->params(), adam_->m(), adam_->v()};
}

absl::StatusOr<std::array<float*, 4>> Trainer::state_on_host() {
  const std::array<gpu::Tensor, 4> st = state();
  std::array<float*, 4> out{};
  gpu::Stream& s = *stream_;
  if (absl::Status e = s.synchronize(); !e.ok()) return e;
  for (std::size_t i = 0; i < st.size(); i++) {
    if (i == 0 && st[0].dtype != gpu::DType::kF32) {
      // bf16/fp16 parameters, widened: what a checkpoint's parameters hold
      // (a restore makes them from the master).
      param_values_.resize(static_cast<std::size_t>(st[0].numel()));
      if (absl::Status e = gpt_->copy_params_to_host(param_values_); !e.ok()) return e;
      out[0] = param_values_.data();
    } else if (i == 1 && !master_.defined()) {
      out[1] = out[0];  // (fp32: the master is the parameters)
    } else if (st[i].host_readable()) {
      out[i] = st[i].host<float>();  // (fp32 where the host reads it: in place)
    } else {
      if (!staged_[i].defined()) {
        staged_[i] = gpu::Tensor::empty_host(s.device(), gpu::DType::kF32, st[i].shape);
      }
      gpu::ops::copy(s, staged_[i], st[i]);
      out[i] = staged_[i].host<float>();
    }
  }
  if (absl::Status e = s.synchronize(); !e.ok()) return e;
  return out;
}

// What state_on_host staged goes back to the device (the rest the host
// wrote in place; bf16/fp16 parameters the caller makes from the master).
absl::Status Trainer::state_to_device() {
  const std::array<gpu::Tensor, 4> st = state();
  for (std::size_t i = 0; i < st.size(); i++) {
    if (staged_[i].defined()) gpu::ops::copy(*stream_, st[i], staged_[i]);
  }
  return stream_->synchronize();
}

namespace {

// The pieces of the one chunk whose state is at `h` (parameters, master, m, v).
std::vector<ckpt::Piece> pieces_at(const ParamLayout& lay, const std::array<float*, 4>& h,
                                   bool optimizer) {
  std::vector<ckpt::Piece> out;
  ckpt::add_chunk_pieces(lay, /*tied_copy=*/false, /*params=*/true, 0, optimizer ? lay.total() : 0,
                         h[0], h[1], h[2], h[3], &out);
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ckpt::Piece>> Trainer::checkpoint_pieces(bool optimizer) {
  absl::StatusOr<std::array<float*, 4>> h = state_on_host();
  if (!h.ok()) return h.status();
  return pieces_at(gpt_->layout(), *h, optimizer);
}

absl::Status Trainer::load_checkpoint(const ckpt::Checkpoint& c, bool optimizer) {
  absl::StatusOr<std::array<float*, 4>> h = state_on_host();
  if (!h.ok()) return h.status();
  const float* params = (*h)[0];
  float* master_data = (*h)[1];
  for (ckpt::Piece& p : pieces_at(gpt_->layout(), *h, optimizer)) {
    // The master copy is the parameters: loaded as the master when there
    // is one, so a resume continues from the optimizer's own fp32 state.
    if (p.kind == ckpt::Kind::kMaster) continue;
    const bool master = optimizer && c.has(ckpt::Kind::kMaster);
    if (p.kind == ckpt::Kind::kParam) {
      if (master) p.kind = ckpt::Kind::kMaster;
      // Mixed precision: into the master; the parameters are it rounded.
      if (master_.defined()) p.data = master_data + (p.data - params);
    }
    if (absl::Status st = c.fill(p); !st.ok()) return st;
  }
  if (absl::Status st = state_to_device(); !st.ok()) return st;
  if (master_.defined()) {
    gpu::ops::convert(*stream_, gpt_->params(), master_);  // the compute copy
    // Parameters only (a fine-tune, or no master in the checkpoint): the
    // master starts from them rounded, as a layout's partitions do.
    if (!(optimizer && c.has(ckpt::Kind::kMaster))) {
      gpu::ops::convert(*stream_, master_, gpt_->params());
    }
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
