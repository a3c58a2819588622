// Generation and evaluation against independent references: the training
// model's full forward (model::Gpt, attention_forward over the whole
// sequence, no cache) recomputed at every step, Megatron's window and mask
// arithmetic written out literally, and one rank against every tp × pp
// layout.
#include "actors/runtime/inference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "model/decoder.h"
#include "model/evaluation.h"
#include "model/generation.h"
#include "model/gpt.h"
#include "model/weights.h"

namespace troupe::actors {
namespace {

// "tiny" (4 layers of 4 heads) with a vocabulary whose padding differs
// with tp, saved as safetensors for each test.
model::GptConfig config() {
  model::GptConfig c = *model::preset("tiny");
  c.V = 800;  // padded to 896 at tp 1, 1024 at tp 2 and 4
  c.T = 48;
  return c;
}

class InferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             absl::StrCat("inference_test_", ::getpid(), ".safetensors"))
                .string();
    gpt_ = std::make_unique<model::Gpt>(config(), 1, gpu::cpu_device());
    EXPECT_TRUE(gpt_->init(7).ok());
    ASSERT_TRUE(model::save_weights(*gpt_, path_).ok());
    std::mt19937 rng(3);
    for (int i = 0; i < 40; i++) stream_.push_back(static_cast<std::int32_t>(rng() % config().V));
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::unique_ptr<ShardedModel> sharded(int tp, int pp,
                                        gpu::Precision precision = gpu::Precision::kFp32) {
    auto m =
        ShardedModel::create(config(), {.tp = tp, .pp = pp},
                             [&](const model::GptConfig& c, const model::ParamLayout& l, float* p) {
                               return model::load_weights_slice(path_, c, l, p);
                             },
                             {.precision = precision});
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // The full forward of `ids` (padded to T; causal, so the padding changes
  // nothing before it): logits (T, Vp) and each position's loss.
  std::vector<float> full_logits(const std::vector<std::int32_t>& ids,
                                 std::vector<float>* losses = nullptr) {
    const model::GptConfig& c = gpt_->config();
    std::vector<std::int32_t> in(static_cast<std::size_t>(c.T), 0), tg(in.size(), 0);
    // At most T inputs; a (T + 1)th id is only the last position's target.
    std::copy_n(ids.begin(), std::min(ids.size(), in.size()), in.begin());
    for (std::size_t i = 0; i + 1 < ids.size() && i < tg.size(); i++) tg[i] = ids[i + 1];
    gpu::Device& d = gpu::cpu_device();
    gpu::Tensor tokens = gpu::Tensor::empty(d, gpu::DType::kI32, {1, c.T});
    gpu::Tensor targets = gpu::Tensor::empty(d, gpu::DType::kI32, {1, c.T});
    EXPECT_TRUE(d.copy_from_host(in.data(), tokens).ok());
    EXPECT_TRUE(d.copy_from_host(tg.data(), targets).ok());
    auto s = d.make_stream({.threads = 1});
    gpt_->forward(*s, tokens, targets);
    EXPECT_TRUE(s->synchronize().ok());
    std::vector<float> out(static_cast<std::size_t>(gpt_->acts().logits.numel()));
    EXPECT_TRUE(d.copy_to_host(gpt_->acts().logits, out.data()).ok());
    if (losses != nullptr) {
      losses->resize(static_cast<std::size_t>(c.T));
      EXPECT_TRUE(d.copy_to_host(gpt_->acts().losses, losses->data()).ok());
    }
    return out;
  }

  std::string path_;
  std::unique_ptr<model::Gpt> gpt_;
  std::vector<std::int32_t> stream_;  // random ids
};

// Greedy decoding with the KV cache picks, at every step, the argmax of the
// full forward recomputed over the whole sequence so far; its logits agree.
TEST_F(InferenceTest, GreedyEqualsTheArgmaxOfTheFullForwardAtEveryStep) {
  auto lm = sharded(1, 1);
  ASSERT_NE(lm, nullptr);
  const std::vector<std::int32_t> prompt(stream_.begin(), stream_.begin() + 5);
  const int V = config().V, Vp = gpt_->config().Vp();
  std::vector<std::int32_t> seq = prompt;
  int steps = 0;
  model::GenerateOptions o{.max_new_tokens = 30, .sampling = {.temperature = 0}, .eod = -1};
  auto g = model::generate(*lm, prompt, o, [&](std::span<const float> logits, std::int32_t id) {
    const std::vector<float> full = full_logits(seq);
    const std::size_t last = (seq.size() - 1) * static_cast<std::size_t>(Vp);
    const std::span<const float> want(full.data() + last, static_cast<std::size_t>(V));
    EXPECT_EQ(id, model::argmax(want)) << "step " << steps;
    double worst = 0;
    for (int v = 0; v < V; v++) worst = std::max(worst, std::abs(double(logits[v]) - want[v]));
    EXPECT_LT(worst, 1e-4) << "step " << steps;
    seq.push_back(id);
    steps++;
  });
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(steps, 30);
  EXPECT_EQ(g->tokens.size(), 30u);
  // Without the cache (the whole sequence every step): the same tokens.
  o.use_cache = false;
  auto again = model::generate(*lm, prompt, o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tokens, g->tokens);
}

// In bf16 and fp16 (parameters, KV cache, activations and logits), a
// prompt and then one position at a time through the cache track the fp32
// full forward: each position's logits within a norm-wise tolerance of the
// format (measured: bf16 8.9e-3, fp16 1.2e-3), on one rank and on tp 2 x pp 2;
// and above fp32's rounding (1e-4): the model did compute in 16 bits.
TEST_F(InferenceTest, Bf16AndFp16DecodingTrackTheFp32FullForward) {
  const int V = config().V, Vp = gpt_->config().Vp(), prompt = 8;
  const std::vector<float> full = full_logits(stream_);
  auto error = [&](std::span<const float> got, std::size_t position) {
    double diff2 = 0, ref2 = 0;
    for (int v = 0; v < V; v++) {
      const double want = full[position * static_cast<std::size_t>(Vp) + v];
      diff2 += (got[v] - want) * (got[v] - want);
      ref2 += want * want;
    }
    return std::sqrt(diff2 / ref2);
  };
  for (gpu::Precision p : {gpu::Precision::kBf16, gpu::Precision::kFp16}) {
    for (auto [tp, pp] : {std::pair{1, 1}, std::pair{2, 2}}) {
      SCOPED_TRACE(absl::StrCat(gpu::precision_name(p), " tp ", tp, " pp ", pp));
      auto lm = sharded(tp, pp, p);
      ASSERT_NE(lm, nullptr);
      double worst = 0;
      auto all = lm->forward(std::span(stream_).first(prompt), 0, model::Logits::kAll);
      ASSERT_TRUE(all.ok()) << all.status();
      for (int i = 0; i < prompt; i++) {
        worst = std::max(worst, error(all->subspan(static_cast<std::size_t>(i * V), V), i));
      }
      for (std::size_t i = prompt; i < stream_.size(); i++) {
        auto last = lm->forward(std::span(stream_).subspan(i, 1), static_cast<std::int64_t>(i),
                                model::Logits::kLast);
        ASSERT_TRUE(last.ok()) << last.status();
        worst = std::max(worst, error(*last, i));
      }
      std::printf("%s tp %d pp %d: worst norm-wise logits error %.2g\n", gpu::precision_name(p), tp,
                  pp, worst);
      EXPECT_LT(worst, p == gpu::Precision::kBf16 ? 3e-2 : 5e-3);
      EXPECT_GT(worst, 1e-4);
    }
  }
}

// The bf16 decoder's parameters, KV cache and activations take half the
// fp32 one's memory (its LayerNorm statistics stay fp32).
TEST_F(InferenceTest, Bf16DecoderHoldsHalfTheMemory) {
  gpu::Device& d = gpu::cpu_device();
  auto held = [&](gpu::DType dtype) {
    const std::int64_t before = d.allocated_bytes();
    model::Decoder dec(config(), d, model::StageSpec::whole(config()), {}, 1, dtype);
    EXPECT_EQ(dec.params().dtype, dtype);
    return d.allocated_bytes() - before;
  };
  const double f32 = static_cast<double>(held(gpu::DType::kF32));
  const double bf16 = static_cast<double>(held(gpu::DType::kBF16));
  EXPECT_GT(bf16, 0.49 * f32);
  EXPECT_LT(bf16, 0.51 * f32);
}

// Every layout gives one rank's logits at every step within 1e-5 and, with
// one seeded generator sampling the gathered logits, the same tokens.
TEST_F(InferenceTest, EveryLayoutSamplesTheSameTokensAsOneRank) {
  const std::vector<std::int32_t> prompt(stream_.begin(), stream_.begin() + 7);
  auto record = [&](model::LanguageModel& lm, std::vector<std::vector<float>>* steps) {
    model::GenerateOptions o{.max_new_tokens = 25, .sampling = {.top_k = 0, .seed = 11}, .eod = -1};
    auto g = model::generate(lm, prompt, o, [&](std::span<const float> l, std::int32_t) {
      steps->emplace_back(l.begin(), l.end());
    });
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? g->tokens : std::vector<std::int32_t>{};
  };
  std::vector<std::vector<float>> want_logits;
  auto one = sharded(1, 1);
  ASSERT_NE(one, nullptr);
  const std::vector<std::int32_t> want = record(*one, &want_logits);
  ASSERT_EQ(want.size(), 25u);
  for (auto [tp, pp] :
       {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}, std::pair{4, 1}, std::pair{1, 4}}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp, " pp ", pp));
    auto lm = sharded(tp, pp);
    ASSERT_NE(lm, nullptr);
    std::vector<std::vector<float>> got_logits;
    EXPECT_EQ(record(*lm, &got_logits), want);
    ASSERT_EQ(got_logits.size(), want_logits.size());
    for (std::size_t s = 0; s < got_logits.size(); s++) {
      ASSERT_EQ(got_logits[s].size(), want_logits[s].size());
      for (std::size_t v = 0; v < got_logits[s].size(); v++) {
        ASSERT_NEAR(got_logits[s][v], want_logits[s][v],
                    1e-5 * std::max(1.0f, std::abs(want_logits[s][v])))
            << "step " << s << " id " << v;
      }
    }
  }
}

// Perplexity in Megatron's overlapping windows equals the sum, written out
// as Megatron's _LMDataset masks it, of the full forward's per-token
// losses; and every layout gives the same.
TEST_F(InferenceTest, PerplexityWithStrideIsMegatronsWindowsOfTheFullForward) {
  const int T = config().T;
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 3; i++) ids.insert(ids.end(), stream_.begin(), stream_.end());  // 120 ids
  for (int stride : {T, 16, 7}) {
    SCOPED_TRACE(absl::StrCat("stride ", stride));
    // Megatron: total_targets = N - 1; windows = max(ceil(max(targets -
    // S, 0) / S) + 1, 1); window w: ids[w*S, w*S + T + 1), its pad mask
    // 1 for real targets, and for w > 0 only the last S positions.
    const int N = static_cast<int>(ids.size()), targets = N - 1;
    const int windows = std::max((std::max(targets - stride, 0) + stride - 1) / stride + 1, 1);
    double nll = 0;
    std::int64_t scored = 0;
    for (int w = 0; w < windows; w++) {
      const int start = w * stride;
      const int real = std::min(T + 1, N - start);  // ids in the window
      if (real < 2) continue;
      std::vector<std::int32_t> window(ids.begin() + start, ids.begin() + start + real);
      std::vector<float> losses;
      full_logits(window, &losses);
      for (int i = 0; i < T; i++) {
        const bool pad = i + 1 >= real;
        const bool masked = stride != T && w != 0 && i < T - stride;
        if (pad || masked) continue;
        nll += losses[static_cast<std::size_t>(i)];
        scored++;
      }
    }
    for (auto [tp, pp] : {std::pair{1, 1}, std::pair{2, 2}}) {
      auto lm = sharded(tp, pp);
      ASSERT_NE(lm, nullptr);
      auto r = model::perplexity(*lm, ids, stride);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->tokens, N - 1);
      EXPECT_EQ(r->tokens, scored);
      EXPECT_NEAR(r->nll, nll, 1e-4 * nll);
    }
  }
  auto lm = sharded(1, 1);
  EXPECT_FALSE(model::perplexity(*lm, ids, 0).ok());
  EXPECT_FALSE(model::perplexity(*lm, ids, T + 1).ok());
}

// Strict LAMBADA: an example is correct when each target id is the full
// forward's argmax; the log-likelihood is the targets' summed log softmax.
TEST_F(InferenceTest, LambadaScoresTargetsAsTheFullForward) {
  std::vector<model::LambadaExample> examples;
  for (int e = 0; e < 6; e++) {
    model::LambadaExample ex;
    ex.context.assign(stream_.begin() + e, stream_.begin() + e + 6 + e);
    ex.target.assign(stream_.begin() + 20 + e, stream_.begin() + 21 + e + e % 3);
    examples.push_back(ex);
  }
  // Make example 0's target the full forward's greedy continuation, so at
  // least one is correct.
  {
    std::vector<std::int32_t> seq = examples[0].context;
    examples[0].target.clear();
    for (int k = 0; k < 2; k++) {
      const std::vector<float> full = full_logits(seq);
      const std::size_t last = (seq.size() - 1) * static_cast<std::size_t>(gpt_->config().Vp());
      const std::int32_t id = model::argmax(
          std::span<const float>(full.data() + last, static_cast<std::size_t>(config().V)));
      examples[0].target.push_back(id);
      seq.push_back(id);
    }
  }
  std::int64_t correct = 0;
  double logprob = 0;
  for (const auto& ex : examples) {
    std::vector<std::int32_t> seq = ex.context;
    seq.insert(seq.end(), ex.target.begin(), ex.target.end());
    const std::vector<float> full = full_logits(seq);
    bool ok = true;
    for (std::size_t i = ex.context.size() - 1; i + 1 < seq.size(); i++) {
      const std::span<const float> row(full.data() + i * gpt_->config().Vp(),
                                       static_cast<std::size_t>(config().V));
      ok = ok && model::argmax(row) == seq[i + 1];
      logprob += model::log_probability(row, seq[i + 1]);
    }
    correct += ok;
  }
  ASSERT_GE(correct, 1);
  for (auto [tp, pp] : {std::pair{1, 1}, std::pair{2, 2}, std::pair{4, 1}}) {
    auto lm = sharded(tp, pp);
    ASSERT_NE(lm, nullptr);
    auto r = model::lambada(*lm, examples);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->total, 6);
    EXPECT_EQ(r->correct, correct);
    EXPECT_NEAR(r->mean_logprob(), logprob / 6, 1e-4 * std::abs(logprob / 6));
  }
}

TEST_F(InferenceTest, BadIdsPositionsAndLayoutsAreErrorsNotCrashes) {
  auto lm = sharded(2, 1);
  ASSERT_NE(lm, nullptr);
  const std::vector<std::int32_t> bad = {3, config().V};
  EXPECT_TRUE(absl::IsInvalidArgument(lm->forward(bad, 0, model::Logits::kLast).status()));
  const std::vector<std::int32_t> ok = {3, 4};
  EXPECT_TRUE(
      absl::IsInvalidArgument(lm->forward(ok, config().T - 1, model::Logits::kLast).status()));
  // A gap in the cache (position 5 before 2..4 were fed).
  ASSERT_TRUE(lm->forward(ok, 0, model::Logits::kLast).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(lm->forward(ok, 5, model::Logits::kLast).status()));
  // A target id outside the vocabulary (never fed, only scored).
  std::vector<std::int32_t> ids = {1, 2, 3, config().V};
  EXPECT_TRUE(absl::IsInvalidArgument(model::perplexity(*lm, ids, 8).status()));
  // The model still works after refusing them.
  EXPECT_TRUE(lm->forward(ok, 0, model::Logits::kLast).ok());
  const std::vector<std::int32_t> prompt(static_cast<std::size_t>(config().T - 3), 1);
  model::GenerateOptions four;
  four.max_new_tokens = 4;
  auto g = model::generate(*lm, prompt, four);
  EXPECT_TRUE(absl::IsInvalidArgument(g.status())) << g.status();
  auto none = [](const auto&, const auto&, float*) { return absl::OkStatus(); };
  auto three = ShardedModel::create(config(), {.tp = 3}, none);
  EXPECT_NE(three.status().message().find("--tp 3"), std::string::npos) << three.status();
  auto pp3 = ShardedModel::create(config(), {.pp = 3}, none);
  EXPECT_NE(pp3.status().message().find("--pp 3"), std::string::npos) << pp3.status();
}

TEST(Sampling, MegatronsFiltersAndTheirErrors) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};
  EXPECT_EQ(model::argmax(logits), 1);  // lowest id on a tie
  model::Sampler greedy({.top_k = 1});
  EXPECT_EQ(greedy.next(logits), 1);
  // top-k 2 keeps ids 1 and 3 (equal), never another.
  model::Sampler k2({.top_k = 2, .seed = 5});
  std::map<int, int> seen;
  for (int i = 0; i < 400; i++) seen[k2.next(logits)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 150);
  EXPECT_GT(seen[3], 150);
  // top-p: p(1) = p(3) = 0.387, p(2) = 0.142, ...; 0.5 keeps 1 and 3 (the
  // one crossing included), 0.8 adds 2.
  model::Sampler p5({.top_p = 0.5, .seed = 5});
  seen.clear();
  for (int i = 0; i < 400; i++) seen[p5.next(logits)]++;
  EXPECT_EQ(seen.size(), 2u);
  model::Sampler p8({.top_p = 0.8, .seed = 5});
  seen.clear();
  for (int i = 0; i < 2000; i++) seen[p8.next(logits)]++;
  EXPECT_EQ(seen.size(), 3u);
  // A tiny temperature tends to greedy, never NaN (1/t overflows).
  for (double t : {1e-310, 1e-300, 1e-30}) {
    model::Sampler tiny_t({.temperature = t, .seed = 5});
    model::Sampler tiny_p({.temperature = t, .top_p = 0.9, .seed = 5});
    for (int i = 0; i < 20; i++) {  // the two most likely (a tie), never another
      const std::int32_t a = tiny_t.next(logits), b = tiny_p.next(logits);
      EXPECT_TRUE(a == 1 || a == 3) << t << ": " << a;
      EXPECT_TRUE(b == 1 || b == 3) << t << ": " << b;
    }
  }
  // One seed, one sequence.
  model::Sampler a({.seed = 9}), b({.seed = 9});
  for (int i = 0; i < 50; i++) EXPECT_EQ(a.next(logits), b.next(logits));
  const model::SamplingOptions both{.top_k = 5, .top_p = 0.5};
  EXPECT_FALSE(both.validate().ok());
  EXPECT_FALSE(model::SamplingOptions{.temperature = -1}.validate().ok());
  EXPECT_FALSE(model::SamplingOptions{.top_p = 1.5}.validate().ok());
  EXPECT_NE(model::SamplingOptions{.top_k = -1}.validate().message().find("--top-k"),
            std::string::npos);
}

}  // namespace
}  // namespace troupe::actors
