// Views and reshapes are checked in every build type: try_view/try_reshape
// return InvalidArgument naming both shapes, view/reshape end the process
// with that message instead of handing out a view past the storage.
#include <gtest/gtest.h>

#include "gpu/device.h"
#include "gpu/tensor.h"

namespace troupe::gpu {
namespace {

class TensorView : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  Tensor x_ = Tensor::empty(cpu_device(), DType::kF32, {4, 8});  // 32 elements
};

TEST_F(TensorView, AViewThatFitsSharesTheStorage) {
  absl::StatusOr<Tensor> row = x_.try_view(24, {8});  // the last row
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->data<float>(), x_.data<float>() + 24);
  EXPECT_EQ(row->storage, x_.storage);
  EXPECT_TRUE(x_.try_view(32, {0}).ok());  // an empty view at the end
}

TEST_F(TensorView, AViewPastTheEndIsAnError) {
  for (const auto& [offset, shape] : std::vector<std::pair<std::int64_t, Shape>>{
           {25, {8}}, {0, {33}}, {-1, {4}}, {0, {5, 8}}, {0, {-2, -16}}, {1, {1LL << 62, 4}}}) {
    absl::StatusOr<Tensor> v = x_.try_view(offset, shape);
    ASSERT_FALSE(v.ok()) << "offset " << offset << " shape " << shape_string(shape);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("of f32[4, 8]: does not fit"), std::string::npos)
        << v.status();
  }
}

TEST_F(TensorView, AViewOfANonContiguousTensorIsAnError) {
  Tensor t = x_;
  t.strides = {1, 4};  // a transposed view
  EXPECT_FALSE(t.try_view(0, {4}).ok());
}

TEST_F(TensorView, AReshapeToAnotherSizeIsAnError) {
  EXPECT_TRUE(x_.try_reshape({32}).ok());
  absl::StatusOr<Tensor> r = x_.try_reshape({4, 9});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the element counts differ"), std::string::npos);
}

// Release builds compile assert() out; these must still be stopped, as an
// InvariantError (which streams and actors report), not undefined behaviour.
TEST_F(TensorView, UncheckedViewPastTheEndIsAnInvariantErrorInEveryBuild) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const InvariantError& e) {
      return std::string(e.what());
    }
    return std::string("nothing thrown");
  };
  EXPECT_EQ(message([&] {
              (void)x_.view(25, {8});
            }).rfind("internal error in Tensor::view: view [8] at offset 25", 0),
            0u);
  EXPECT_EQ(message([&] { (void)x_.reshape({33}); }).rfind("internal error in Tensor::reshape", 0),
            0u);
}

}  // namespace
}  // namespace troupe::gpu
