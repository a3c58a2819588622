// The single-rank step loop.
#include "model/trainer.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "gpu/ops.h"
#include "model/data/synthetic.h"
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
    return absl::InvalidArgumentError("--lr-warmup-iters and --lr-decay-iters must not be negative");
  }
  if (!(adam.beta1 >= 0.0f && adam.beta1 < 1.0f) || !(adam.beta2 >= 0.0f && adam.beta2 < 1.0f)) {
    return absl::InvalidArgumentError("--adam-beta1 and --adam-beta2 must be in [0, 1)");
  }
  if (!(adam.eps > 0.0f)) return absl::InvalidArgumentError("--adam-eps must be positive");
  if (!(adam.weight_decay >= 0.0f)) {
    return absl::InvalidArgumentError("--weight-decay must not be negative");
  }
  if (threads < 0) return absl::InvalidArgumentError("--threads must not be negative");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& options) {
  absl::Status st = options.validate();
  if (!st.ok()) return st;
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  const GptConfig& c = options.model;

  std::unique_ptr<data::TokenSource> source;
  if (options.data_path.empty()) {
    data::PhraseCorpusOptions corpus;
    corpus.vocab_size = c.V;
    corpus.seed = options.seed;
    std::vector<std::int32_t> tokens;
    for (const auto& doc : data::phrase_corpus(corpus)) {
      tokens.insert(tokens.end(), doc.begin(), doc.end());
    }
    source = data::memory_source("synthetic phrase corpus", std::move(tokens));
  } else {
    auto opened = data::open_indexed_source(options.data_path);
    if (!opened.ok()) return opened.status();
    source = std::move(*opened);
  }
  auto loader = data::GptLoader::create(
      std::move(source), {.T = c.T, .V = c.V, .seed = options.seed, .shuffle = options.shuffle});
  if (!loader.ok()) return loader.status();
  t->loader_ = std::move(*loader);

  gpu::Device& dev = gpu::cpu_device();
  t->stream_ = dev.make_stream({.threads = options.threads});
  t->gpt_ = std::make_unique<Gpt>(c, options.micro_batch, dev);
  if (options.init_weights.empty()) {
    t->gpt_->init(options.seed);
  } else {
    st = load_weights(options.init_weights, *t->gpt_);
    if (!st.ok()) return st;
  }
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

absl::Status Trainer::step(StepMetrics* metrics) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const int B = options_.micro_batch, T = options_.model.T, m = options_.grad_accum();
  const std::int64_t gbs = options_.global_batch;
  const std::int64_t tokens_per_step = gbs * T;
  gpu::Stream& s = *stream_;
  gpu::Device& dev = s.device();

  // Micro-batch j of this step is samples [step*GBS + j*B, +B) of the run.
  std::vector<std::int32_t> tok(static_cast<std::size_t>(B) * T), tgt(tok.size());
  for (int j = 0; j < m; j++) {
    absl::Status st = loader_->batch(steps_done_ * gbs + static_cast<std::int64_t>(j) * B, B,
                                     tok.data(), tgt.data());
    if (!st.ok()) return st;
    (void)dev.copy_from_host(tok.data(), tokens_[static_cast<std::size_t>(j)]);
    (void)dev.copy_from_host(tgt.data(), targets_[static_cast<std::size_t>(j)]);
  }

  // Per-micro-batch loss sums, each in token order, added in micro-batch order.
  std::vector<double> loss_sums(static_cast<std::size_t>(m), 0.0);
  std::vector<float> losses_host(tok.size());
  gpt_->zero_grad(s);
  const float dloss = 1.0f / static_cast<float>(tokens_per_step);
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
    gpt_->backward(s, tk, tg, dloss);
  }
  gpu::ops::squared_norm(s, norm_, gpt_->grads());
  absl::Status st = s.synchronize();
  if (!st.ok()) return st;
  double sq = 0.0;
  (void)dev.copy_to_host(norm_, &sq);

  const int step = steps_done_ + 1;
  const double grad_norm = std::sqrt(sq);
  const float lr = lr_at(options_.lr, step);
  adam_->step(s, gpt_->params(), gpt_->grads(), options_.adam, lr, step,
              clip_factor(grad_norm, options_.clip_grad));
  st = s.synchronize();
  if (!st.ok()) return st;
  steps_done_ = step;

  double loss = 0.0;
  for (double l : loss_sums) loss += l;
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  *metrics = {.step = step,
              .loss = loss / static_cast<double>(tokens_per_step),
              .grad_norm = grad_norm,
              .lr = lr,
              .step_s = secs,
              .tokens_per_s = static_cast<double>(tokens_per_step) / secs};
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::evaluate(const std::vector<std::int32_t>& tokens,
                                         const std::vector<std::int32_t>& targets) {
  gpu::Stream& s = *stream_;
  gpu::Device& dev = s.device();
  const gpu::Tensor& tk = tokens_[0];
  const gpu::Tensor& tg = targets_[0];
  if (tokens.size() != static_cast<std::size_t>(tk.numel()) || targets.size() != tokens.size()) {
    return absl::InvalidArgumentError("evaluate: tokens and targets must be (B, T)");
  }
  (void)dev.copy_from_host(tokens.data(), tk);
  (void)dev.copy_from_host(targets.data(), tg);
  gpt_->forward(s, tk, tg);
  absl::Status st = s.synchronize();
  if (!st.ok()) return st;
  std::vector<float> losses(tokens.size());
  (void)dev.copy_to_host(gpt_->acts().losses, losses.data());
  double sum = 0.0;
  for (float l : losses) sum += l;
  return sum / static_cast<double>(losses.size());
}

}  // namespace troupe::model
