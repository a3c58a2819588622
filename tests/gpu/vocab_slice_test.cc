// Vocab-parallel embedding and cross-entropy: P ranks' slices of the
// vocabulary, combined, give what one rank computes with all of it,
// including a vocabulary (V = 500 of Vp = 512) whose last slice is part
// padding.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpu/ops.h"
#include "tests/test_util.h"

namespace troupe::gpu {
namespace {

using testing::random_tensor;

constexpr int kB = 2, kT = 8, kC = 16, kV = 500, kVp = 512;

Tensor tokens_below(std::mt19937& rng, int n, int limit) {
  std::uniform_int_distribution<int> d(0, limit - 1);
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng);
  v[0] = limit - 1;  // the last real id, in the last slice
  return testing::int_tensor(v, {n});
}

class VocabSlices : public ::testing::TestWithParam<int> {};

TEST_P(VocabSlices, EmbeddingSlicesSumToTheWholeLookup) {
  const int P = GetParam(), rows = kVp / P;
  std::mt19937 rng(7);
  auto s = cpu_device().make_stream({.threads = 2});
  Tensor wte = random_tensor(rng, {kVp, kC}), wpe = random_tensor(rng, {kT, kC});
  Tensor tokens = tokens_below(rng, kB * kT, kV).reshape({kB, kT});
  Tensor whole = Tensor::empty(cpu_device(), DType::kF32, {kB, kT, kC});
  ops::embedding_forward(*s, whole, tokens, wte, wpe);
  Tensor zeros = testing::filled({kT, kC}, 0.0f);
  Tensor sum = testing::filled({kB, kT, kC}, 0.0f);
  Tensor part = Tensor::empty(cpu_device(), DType::kF32, {kB, kT, kC});
  for (int p = 0; p < P; p++) {
    // As Megatron: the position embedding is added once (rank 0 here).
    ops::embedding_forward(*s, part, tokens, wte.view(p * rows * kC, {rows, kC}),
                           p == 0 ? wpe : zeros, {.begin = p * rows, .total = kV});
    ops::axpy(*s, sum, 1.0f, part);
  }
  ASSERT_TRUE(s->synchronize().ok());
  for (std::int64_t i = 0; i < whole.numel(); i++) {
    ASSERT_EQ(sum.data<float>()[i], whole.data<float>()[i]) << i;  // exact: x + 0 = x
  }

  // Backward: each slice gets its rows' gradient, every rank the same dwpe.
  Tensor dout = random_tensor(rng, {kB, kT, kC});
  Tensor dwte = testing::filled({kVp, kC}, 0.0f), dwpe = testing::filled({kT, kC}, 0.0f);
  ops::embedding_backward(*s, dwte, dwpe, dout, tokens);
  for (int p = 0; p < P; p++) {
    Tensor dw = testing::filled({rows, kC}, 0.0f), dp = testing::filled({kT, kC}, 0.0f);
    ops::embedding_backward(*s, dw, dp, dout, tokens, {.begin = p * rows, .total = kV});
    ASSERT_TRUE(s->synchronize().ok());
    for (std::int64_t i = 0; i < dw.numel(); i++) {
      ASSERT_EQ(dw.data<float>()[i], dwte.data<float>()[p * rows * kC + i]);
    }
    for (std::int64_t i = 0; i < dp.numel(); i++) {
      ASSERT_EQ(dp.data<float>()[i], dwpe.data<float>()[i]);
    }
  }
}

TEST_P(VocabSlices, CrossEntropyFromSlicesMatchesTheWholeVocabulary) {
  const int P = GetParam(), rows = kVp / P, N = kB * kT;
  std::mt19937 rng(11);
  auto s = cpu_device().make_stream({.threads = 2});
  Tensor logits = random_tensor(rng, {N, kVp}, 3.0f);
  Tensor targets = tokens_below(rng, N, kV);
  Tensor losses = Tensor::empty(cpu_device(), DType::kF32, {N});
  Tensor lse = Tensor::empty(cpu_device(), DType::kF32, {N});
  ops::crossentropy_forward(*s, losses, lse, logits, targets, kV);
  Tensor stats = Tensor::empty(cpu_device(), DType::kF32, {P, N, 3});
  std::vector<Tensor> slices;
  for (int p = 0; p < P; p++) {
    // Each rank's logits are its columns of the whole (as its matmul makes them).
    Tensor mine = Tensor::empty(cpu_device(), DType::kF32, {N, rows});
    for (int n = 0; n < N; n++) {
      for (int j = 0; j < rows; j++) {
        mine.data<float>()[n * rows + j] = logits.data<float>()[n * kVp + p * rows + j];
      }
    }
    slices.push_back(mine);
    ops::crossentropy_partial(*s, stats.view(p * N * 3, {N, 3}), mine, targets, kV,
                              {.begin = p * rows, .total = kV});
  }
  Tensor plosses = Tensor::empty(cpu_device(), DType::kF32, {N});
  Tensor plse = Tensor::empty(cpu_device(), DType::kF32, {N});
  ops::crossentropy_combine(*s, plosses, plse, stats);
  ASSERT_TRUE(s->synchronize().ok());
  for (int n = 0; n < N; n++) {
    EXPECT_NEAR(plse.data<float>()[n], lse.data<float>()[n],
                1e-5f * std::abs(lse.data<float>()[n]));
    EXPECT_NEAR(plosses.data<float>()[n], losses.data<float>()[n], 1e-5f);
  }
  // Backward with the combined lse: each slice's part of the whole gradient.
  const float dloss = 0.25f;
  ops::crossentropy_backward(*s, logits, logits, lse, targets, dloss, kV);
  for (int p = 0; p < P; p++) {
    Tensor& mine = slices[static_cast<std::size_t>(p)];
    ops::crossentropy_backward(*s, mine, mine, plse, targets, dloss, kV,
                               {.begin = p * rows, .total = kV});
    ASSERT_TRUE(s->synchronize().ok());
    for (int n = 0; n < N; n++) {
      for (int j = 0; j < rows; j++) {
        ASSERT_NEAR(mine.data<float>()[n * rows + j], logits.data<float>()[n * kVp + p * rows + j],
                    1e-6f)
            << "slice " << p << " row " << n << " column " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, VocabSlices, ::testing::Values(1, 2, 4));

TEST(VocabSlices, IdsOutsideTheVocabularyAreStillErrors) {
  auto s = cpu_device().make_stream({.threads = 1});
  Tensor wte = testing::filled({4, kC}, 0.0f), wpe = testing::filled({kT, kC}, 0.0f);
  Tensor tokens = testing::int_tensor(std::vector<std::int32_t>(kT, 9), {1, kT});
  Tensor out = Tensor::empty(cpu_device(), DType::kF32, {1, kT, kC});
  ops::embedding_forward(*s, out, tokens, wte, wpe, {.begin = 4, .total = 8});
  absl::Status st = s->synchronize();
  EXPECT_NE(st.message().find("a token id is outside [0, 8)"), std::string::npos) << st;
}

}  // namespace
}  // namespace troupe::gpu
