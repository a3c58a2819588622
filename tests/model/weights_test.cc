// safetensors weights: round trip, the Hugging Face variants troupe accepts,
// and a clear error for every kind of bad file.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "model/gpt.h"
#include "model/safetensors.h"

namespace troupe::model {
namespace {

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = *preset("tiny");
    config_.L = 2;
    config_.V = 500;  // padded to 512 inside
    gpt_ = std::make_unique<Gpt>(config_, 1, gpu::cpu_device());
    EXPECT_TRUE(gpt_->init(3).ok());
    // ctest runs tests in parallel processes: every test its own files.
    name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = ::testing::TempDir() + "/troupe_weights_" + name_ + ".safetensors";
    ASSERT_TRUE(save_weights(*gpt_, path_).ok());
  }
  // Rewrites the saved file with `edit` applied to its tensor list.
  std::string rewrite(const std::function<void(std::vector<TensorToWrite>&,
                                               std::map<std::string, std::string>&)>& edit) {
    auto f = SafetensorsFile::open(path_);
    EXPECT_TRUE(f.ok());
    keep_ = std::make_unique<SafetensorsFile>(std::move(*f));
    std::vector<TensorToWrite> ts;
    for (const auto& e : keep_->entries()) {
      auto b = keep_->bytes(e);
      ts.push_back({e.name, e.dtype, e.shape, b.data(), b.size()});
    }
    auto meta = keep_->metadata();
    edit(ts, meta);
    const std::string out =
        ::testing::TempDir() + "/troupe_weights_edited_" + name_ + ".safetensors";
    EXPECT_TRUE(write_safetensors(out, ts, meta).ok());
    return out;
  }
  absl::Status load(const std::string& path) {
    Gpt other(config_, 1, gpu::cpu_device());
    return load_weights(path, other);
  }

  GptConfig config_;
  std::unique_ptr<Gpt> gpt_;
  std::string name_, path_;
  std::unique_ptr<SafetensorsFile> keep_;
};

TEST_F(WeightsTest, RoundTripIsBitwise) {
  Gpt other(config_, 1, gpu::cpu_device());
  ASSERT_TRUE(load_weights(path_, other).ok());
  EXPECT_EQ(std::memcmp(other.params().raw(), gpt_->params().raw(), gpt_->params().nbytes()), 0);
}

TEST_F(WeightsTest, FileHoldsHuggingFaceNamesShapesAndMetadata) {
  auto f = SafetensorsFile::open(path_);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->find("wte.weight")->shape, (std::vector<std::int64_t>{500, 64}));  // V rows
  EXPECT_EQ(f->find("h.1.attn.c_attn.weight")->shape, (std::vector<std::int64_t>{64, 192}));
  EXPECT_EQ(f->find("h.1.mlp.c_proj.weight")->shape, (std::vector<std::int64_t>{256, 64}));
  EXPECT_EQ(f->metadata().at("n_head"), "4");
  EXPECT_EQ(f->metadata().at("vocab_size"), "500");
  EXPECT_EQ(f->entries().size(), 2u + 12u * 2 + 2u);
}

TEST_F(WeightsTest, AcceptsPrefixLmHeadMaskBuffersAndPaddedRows) {
  std::vector<float> padded_wte(512 * 64, 0.0f), mask(64 * 64, 1.0f);
  std::string p = rewrite([&](auto& ts, auto&) {
    for (auto& t : ts) {
      if (t.name == "wte.weight") {
        std::memcpy(padded_wte.data(), t.data, t.nbytes);
        ts.push_back({"lm_head.weight", "F32", t.shape, t.data, t.nbytes});
        t = {"wte.weight", "F32", {512, 64}, padded_wte.data(), padded_wte.size() * 4};
      }
    }
    for (auto& t : ts) t.name = "transformer." + t.name;
    ts.push_back({"h.0.attn.bias", "F32", {64, 64}, mask.data(), mask.size() * 4});
  });
  Gpt other(config_, 1, gpu::cpu_device());
  absl::Status st = load_weights(p, other);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(std::memcmp(other.params().raw(), gpt_->params().raw(), gpt_->params().nbytes()), 0);
}

TEST_F(WeightsTest, MissingTensorIsNamed) {
  std::string p = rewrite([](auto& ts, auto&) {
    std::erase_if(ts, [](const TensorToWrite& t) { return t.name == "h.1.ln_2.bias"; });
  });
  absl::Status st = load(p);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("missing tensor 'h.1.ln_2.bias'"), absl::string_view::npos) << st;
}

// One rank's chunk from the file, reading only its tensors: every TP slice
// of every stage equals the slice of the model that was saved.
TEST_F(WeightsTest, ASliceLoadsItsPartOfTheSavedModel) {
  GptConfig sliced = config_;
  sliced.vocab_multiple *= 2;  // as the ranks of --tp 2 hold it (Vp 512 either way)
  const ParamLayout whole = ParamLayout::gpt(sliced);
  std::vector<float> saved(static_cast<std::size_t>(whole.total()));
  std::memcpy(saved.data(), gpt_->params().data<float>(), saved.size() * sizeof(float));
  for (const StageSpec stage : {StageSpec{0, 1, true, false}, StageSpec{1, 2, false, true}}) {
    for (int t = 0; t < 2; t++) {
      const ParamLayout slice = ParamLayout::gpt(sliced, stage, {2, t});
      std::vector<float> got(static_cast<std::size_t>(slice.total()), -1.0f);
      absl::Status st = load_weights_slice(path_, sliced, slice, got.data());
      ASSERT_TRUE(st.ok()) << st;
      for (const ParamSpec& spec : slice.specs()) {
        const ParamSpec& w = *whole.find_or_null(spec.name);
        for (std::int64_t i = 0; i < spec.numel(); i++) {
          ASSERT_EQ(got[static_cast<std::size_t>(spec.offset + i)],
                    saved[static_cast<std::size_t>(w.offset + spec.global_index(i))])
              << spec.name << " element " << i << " of slice " << t;
        }
      }
    }
  }
}

// A file that would not load whole does not load in slices either, even
// when the slice does not hold the bad tensor (checked from the header).
TEST_F(WeightsTest, ASliceOfABadFileIsTheSameError) {
  std::string p = rewrite([](auto& ts, auto&) {
    std::erase_if(ts, [](const TensorToWrite& t) { return t.name == "h.1.ln_2.bias"; });
  });
  const ParamLayout first = ParamLayout::gpt(config_, StageSpec{0, 1, true, false});
  std::vector<float> got(static_cast<std::size_t>(first.total()));
  absl::Status st = load_weights_slice(p, config_, first, got.data());
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("missing tensor 'h.1.ln_2.bias'"), absl::string_view::npos) << st;
}

TEST_F(WeightsTest, WrongShapeIsNamed) {
  std::string p = rewrite([](auto& ts, auto&) {
    for (auto& t : ts)
      if (t.name == "h.0.mlp.c_fc.weight") t.shape = {256, 64};  // not transposed
  });
  absl::Status st = load(p);
  EXPECT_NE(st.message().find("tensor 'h.0.mlp.c_fc.weight' has shape [256, 64], want [64, 256]"),
            absl::string_view::npos)
      << st;
}

TEST_F(WeightsTest, WrongDtypeIsNamed) {
  std::string p = rewrite([](auto& ts, auto&) {
    for (auto& t : ts)
      if (t.name == "ln_f.weight") {
        t.dtype = "F16";
        t.shape = {128};
      }
  });
  absl::Status st = load(p);
  EXPECT_NE(st.message().find("tensor 'ln_f.weight' has dtype F16, want F32"),
            absl::string_view::npos)
      << st;
}

TEST_F(WeightsTest, MetadataThatDisagreesIsAnError) {
  std::string p = rewrite([](auto&, auto& meta) { meta["n_head"] = "8"; });
  absl::Status st = load(p);
  EXPECT_NE(st.message().find("metadata n_head = 8 but the model has 4"), absl::string_view::npos)
      << st;
}

TEST_F(WeightsTest, UnexpectedTensorIsAnError) {
  std::vector<float> extra(64, 0.0f);
  std::string p = rewrite([&](auto& ts, auto&) {
    ts.push_back({"h.2.ln_1.weight", "F32", {64}, extra.data(), 256});
  });
  EXPECT_NE(load(p).message().find("unexpected tensor 'h.2.ln_1.weight'"), absl::string_view::npos);
}

TEST_F(WeightsTest, TruncatedFileIsAnError) {
  std::ifstream in(path_, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string p = ::testing::TempDir() + "/troupe_truncated.safetensors";
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 1000));
  absl::Status st = load(p);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("truncated file"), absl::string_view::npos) << st;
  std::ofstream(p, std::ios::binary).write(bytes.data(), 5);
  EXPECT_NE(load(p).message().find("truncated"), absl::string_view::npos);
}

TEST_F(WeightsTest, ShapesThatOverflowAreAnError) {
  // 2^62 floats would wrap to 0 bytes in 64 bits (a regression test).
  const std::string header =
      R"({"wte.weight":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})";
  std::string file(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header;
  const std::string p = ::testing::TempDir() + "/troupe_overflow.safetensors";
  std::ofstream(p, std::ios::binary) << file;
  auto f = SafetensorsFile::open(p);
  EXPECT_TRUE(absl::IsInvalidArgument(f.status()));
  EXPECT_NE(f.status().message().find("overflows"), absl::string_view::npos) << f.status();
}

TEST_F(WeightsTest, NotASafetensorsFileIsAnError) {
  const std::string p = ::testing::TempDir() + "/troupe_not_weights.safetensors";
  std::ofstream(p) << "{\"this is\": \"json, not safetensors\"}\n";
  absl::Status st = load(p);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::IsNotFound(load("/nonexistent/w.safetensors")));
}

// Writers of one path used to share "<path>.tmp": one renamed the other's
// half-written file into place, or found it gone. Each now has its own
// temporary; every save succeeds, the file is one writer's whole file, and
// no temporary is left in the directory.
TEST_F(WeightsTest, ConcurrentSavesToOnePathDoNotCollide) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("troupe_weights_dir_" + name_);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = dir / "w.safetensors";
  std::vector<std::unique_ptr<Gpt>> models;
  for (int i = 0; i < 4; i++) {
    models.push_back(std::make_unique<Gpt>(config_, 1, gpu::cpu_device()));
    ASSERT_TRUE(models.back()->init(10 + i).ok());
  }
  for (int round = 0; round < 5; round++) {
    std::vector<absl::Status> results(models.size());
    std::vector<std::thread> writers;
    for (std::size_t i = 0; i < models.size(); i++) {
      writers.emplace_back([&, i] { results[i] = save_weights(*models[i], path); });
    }
    for (std::thread& t : writers) t.join();
    for (const absl::Status& st : results) ASSERT_TRUE(st.ok()) << st;
    Gpt back(config_, 1, gpu::cpu_device());
    ASSERT_TRUE(load_weights(path, back).ok());
    const std::size_t bytes = back.params().nbytes();
    int equal_to = 0;
    for (const auto& m : models) {
      equal_to += std::memcmp(m->params().raw(), back.params().raw(), bytes) == 0;
    }
    EXPECT_EQ(equal_to, 1) << "round " << round << ": not one writer's whole file";
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
    EXPECT_EQ(files, 1) << "round " << round << ": a temporary was left behind";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::model
