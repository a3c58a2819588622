// troupe's GPT against PyTorch: the `tiny` model from the same safetensors
// weights, one batch (logits, loss, every gradient), then 10 AdamW steps
// (losses), with each attention kernel (flash and reference). The fixture is made by
// tests/reference/make_gpt_fixture.py.
#include <gtest/gtest.h>

#include <cstring>

#include "gpu/ops.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace troupe::testing {
namespace {

using model::SafetensorsFile;

std::string fixture_dir() { return TROUPE_SOURCE_DIR "/tests/reference/data/"; }

std::vector<double> tensor_values(const SafetensorsFile& f, const std::string& name) {
  const model::SafetensorsEntry* e = f.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (e == nullptr) return {};
  auto bytes = f.bytes(*e);
  std::vector<double> v(bytes.size() / 4);
  for (std::size_t i = 0; i < v.size(); i++) {
    float x;
    std::memcpy(&x, bytes.data() + 4 * i, 4);
    v[i] = x;
  }
  return v;
}

std::vector<std::int32_t> int_values(const SafetensorsFile& f, const std::string& name) {
  auto bytes = f.bytes(*f.find(name));
  std::vector<std::int32_t> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

class GptReferenceTest : public ::testing::TestWithParam<model::AttentionKernel> {
 protected:
  void SetUp() override {
    auto fx = SafetensorsFile::open(fixture_dir() + "tiny_fixture.safetensors");
    ASSERT_TRUE(fx.ok()) << fx.status();
    fixture_ = std::make_unique<SafetensorsFile>(std::move(*fx));
    config_ = *model::preset("tiny");
    B_ = static_cast<int>(fixture_->find("inputs")->shape[0]);
    gpt_ = std::make_unique<model::Gpt>(
        config_, B_, gpu::cpu_device(), model::StageSpec::whole(config_), 1,
        model::TensorParallel{}, model::ActivationOptions{.attention = GetParam()});
    absl::Status st = model::load_weights(fixture_dir() + "tiny_weights.safetensors", *gpt_);
    ASSERT_TRUE(st.ok()) << st;
    stream_ = gpu::cpu_device().make_stream({.threads = 2});
    tokens_ = int_tensor(int_values(*fixture_, "inputs"), {B_, config_.T});
    targets_ = int_tensor(int_values(*fixture_, "targets"), {B_, config_.T});
  }

  double mean_loss() {
    double s = 0;
    const gpu::Tensor& l = gpt_->acts().losses;
    for (std::int64_t i = 0; i < l.numel(); i++) s += l.data<float>()[i];
    return s / static_cast<double>(l.numel());
  }

  std::unique_ptr<SafetensorsFile> fixture_;
  model::GptConfig config_;
  int B_ = 0;
  std::unique_ptr<model::Gpt> gpt_;
  std::unique_ptr<gpu::Stream> stream_;
  gpu::Tensor tokens_, targets_;
};

TEST_P(GptReferenceTest, LogitsLossAndEveryGradient) {
  gpt_->zero_grad(*stream_);
  gpt_->forward(*stream_, tokens_, targets_);
  ASSERT_TRUE(stream_->synchronize().ok());
  EXPECT_LT(rel_error(to_double(gpt_->acts().logits), tensor_values(*fixture_, "logits")), 1e-4);
  const double want_loss = tensor_values(*fixture_, "loss")[0];
  EXPECT_NEAR(mean_loss(), want_loss, 1e-5 * want_loss);

  const float dloss = 1.0f / static_cast<float>(B_ * config_.T);
  gpt_->backward(*stream_, tokens_, targets_, dloss);
  ASSERT_TRUE(stream_->synchronize().ok());
  // Save the gradients in the file layout by saving a model whose parameters
  // are the gradients, then compare tensor by tensor.
  model::Gpt grads_as_model(config_, 1, gpu::cpu_device());
  std::memcpy(grads_as_model.params().raw(), gpt_->grads().raw(), gpt_->grads().nbytes());
  const std::string path = ::testing::TempDir() + "/troupe_grads.safetensors";
  ASSERT_TRUE(model::save_weights(grads_as_model, path).ok());
  auto got = SafetensorsFile::open(path);
  ASSERT_TRUE(got.ok());
  int checked = 0;
  for (const model::ParamSpec& spec : gpt_->layout().specs()) {
    SCOPED_TRACE(spec.name);
    EXPECT_LT(
        rel_error(tensor_values(*got, spec.name), tensor_values(*fixture_, "grad." + spec.name)),
        1e-4);
    checked++;
  }
  EXPECT_EQ(checked, 2 + 12 * config_.L + 2);
}

TEST_P(GptReferenceTest, TenAdamWStepsFollowPyTorch) {
  const auto& meta = fixture_->metadata();
  model::AdamWConfig adam{.beta1 = std::stof(meta.at("beta1")),
                          .beta2 = std::stof(meta.at("beta2")),
                          .eps = std::stof(meta.at("eps")),
                          .weight_decay = std::stof(meta.at("weight_decay"))};
  const float lr = std::stof(meta.at("lr")), clip = std::stof(meta.at("clip_grad"));
  model::AdamW opt(gpt_->layout(), gpu::cpu_device(), *stream_);
  gpu::Tensor norm = gpu::Tensor::empty(gpu::cpu_device(), gpu::DType::kF64, {1});
  std::vector<double> want = tensor_values(*fixture_, "losses");
  ASSERT_EQ(want.size(), 10u);
  for (int step = 1; step <= 10; step++) {
    gpt_->zero_grad(*stream_);
    gpt_->forward(*stream_, tokens_, targets_);
    gpt_->backward(*stream_, tokens_, targets_, 1.0f / static_cast<float>(B_ * config_.T));
    gpu::ops::squared_norm(*stream_, norm, gpt_->grads());
    ASSERT_TRUE(stream_->synchronize().ok());
    EXPECT_NEAR(mean_loss(), want[step - 1], 1e-5 * want[step - 1]) << "step " << step;
    const double gn = std::sqrt(*norm.data<double>());
    opt.step(*stream_, gpt_->params(), gpt_->grads(), adam, lr, step, model::clip_factor(gn, clip));
  }
  ASSERT_TRUE(stream_->synchronize().ok());
}

INSTANTIATE_TEST_SUITE_P(Attention, GptReferenceTest,
                         ::testing::Values(model::AttentionKernel::kFlash,
                                           model::AttentionKernel::kReference),
                         [](const ::testing::TestParamInfo<model::AttentionKernel>& info) {
                           return model::attention_kernel_name(info.param);
                         });

// The norm-wise error the tests compare with tolerances: comparing nothing,
// or vectors of different sizes, must not pass (it returned 0 for an empty
// result, and read past the reference's end for a longer one).
TEST(RelError, ComparingNothingOrUnequalSizesNeverPasses) {
  EXPECT_EQ(rel_error({1.0, 2.0}, {1.0, 2.0}), 0.0);
  EXPECT_DOUBLE_EQ(rel_error({3.0, 4.0}, {0.0, 8.0}), 5.0 / 8.0);  // ||(3, -4)|| / ||(0, 8)||
  EXPECT_FALSE(rel_error({}, {1.0, 2.0}) < 1e-4);
  EXPECT_FALSE(rel_error({1.0}, {1.0, 2.0}) < 1e-4);
  EXPECT_FALSE(rel_error({1.0, 2.0, 3.0}, {1.0, 2.0}) < 1e-4);
  EXPECT_FALSE(rel_error({}, {}) < 1e-4);
}

}  // namespace
}  // namespace troupe::testing
