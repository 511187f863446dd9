// The op profile: ops add their time to their own category only while profiling is on, and an
// OpTimer inside another counts nothing (the outer one holds the time).
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "tensor/op_profile.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

TEST(OpProfile, OpsCountInTheirCategoryOnlyWhileOn) {
  Tensor a = Tensor::full({256, 256}, 0.5), b = Tensor::full({256, 256}, 0.25);
  Tensor c = Tensor::empty({256, 256});
  set_op_profiling(false);
  const double gemm0 = op_seconds(OpCategory::kGemm);
  ops::matmul(c, a, false, b, false);
  EXPECT_EQ(op_seconds(OpCategory::kGemm), gemm0) << "off: nothing counted";

  set_op_profiling(true);
  const double ce0 = op_seconds(OpCategory::kCrossEntropy);
  ops::matmul(c, a, false, b, false);
  const double gemm1 = op_seconds(OpCategory::kGemm);
  EXPECT_GT(gemm1, gemm0);
  const double elt0 = op_seconds(OpCategory::kNormElementwise);
  ops::add(c, a, b);
  EXPECT_GT(op_seconds(OpCategory::kNormElementwise), elt0);
  EXPECT_EQ(op_seconds(OpCategory::kGemm), gemm1) << "an add is not a GEMM";
  EXPECT_EQ(op_seconds(OpCategory::kCrossEntropy), ce0);
  set_op_profiling(false);
}

TEST(OpProfile, NestedTimersCountOnceInTheOutermost) {
  set_op_profiling(true);
  const double gemm0 = op_seconds(OpCategory::kGemm);
  const double attn0 = op_seconds(OpCategory::kAttention);
  {
    const OpTimer outer(OpCategory::kAttention);
    const OpTimer inner(OpCategory::kGemm);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(op_seconds(OpCategory::kGemm), gemm0);
  EXPECT_GE(op_seconds(OpCategory::kAttention) - attn0, 0.015);
  set_op_profiling(false);
}

// By op: the public ops' names, the outermost op's name holding nested time, largest first.
TEST(OpProfile, TimeIsAlsoKeptByOpName) {
  auto seconds_of = [](const std::string& op) {
    for (const auto& [name, sec] : op_seconds_by_op())
      if (name == op) return sec;
    return 0.0;
  };
  Tensor a = Tensor::full({128, 128}, 0.5), b = Tensor::full({128, 128}, 0.25);
  Tensor c = Tensor::empty({128, 128});
  set_op_profiling(true);
  const double add0 = seconds_of("add"), matmul0 = seconds_of("matmul");
  ops::add(c, a, b);
  EXPECT_GT(seconds_of("add"), add0);
  EXPECT_EQ(seconds_of("matmul"), matmul0);
  {
    const OpTimer outer(OpCategory::kAttention, "outer op");
    const OpTimer inner(OpCategory::kGemm, "inner op");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  set_op_profiling(false);
  EXPECT_GE(seconds_of("outer op"), 0.015);
  EXPECT_EQ(seconds_of("inner op"), 0.0);
  const auto all = op_seconds_by_op();
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GE(all[i - 1].second, all[i].second);
}

// GEMMs are also kept by shape: m x n x k of op(A) op(B), the transposes, the input dtype and
// "+=" when accumulating; one call each, 2 m n k FLOPs; a GEMM inside another op counts nothing.
TEST(OpProfile, GemmsAreAlsoKeptByShape) {
  auto shape_time = [](const std::string& key) {
    for (const auto& [shape, t] : gemm_times_by_shape())
      if (shape == key) return t;
    return ShapeTime{};
  };
  Tensor a = Tensor::full({24, 40}, 0.5), b = Tensor::full({24, 16}, 0.25);
  Tensor c = Tensor::zeros({40, 16});
  set_op_profiling(true);
  const ShapeTime acc0 = shape_time("40x16x24 TN f32 +="), plain0 = shape_time("40x16x24 TN f32");
  ops::matmul(c, a, true, b, false, 1.0f);
  ops::matmul(c, a, true, b, false, 1.0f);
  ops::matmul(c, a, true, b, false);
  {
    const OpTimer outer(OpCategory::kAttention, "outer op");
    ops::matmul(c, a, true, b, false);
  }
  set_op_profiling(false);
  ops::matmul(c, a, true, b, false);
  const ShapeTime acc = shape_time("40x16x24 TN f32 +="), plain = shape_time("40x16x24 TN f32");
  EXPECT_EQ(acc.calls - acc0.calls, 2);
  EXPECT_EQ(acc.flops - acc0.flops, 2 * 2.0 * 40 * 16 * 24);
  EXPECT_GT(acc.seconds, acc0.seconds);
  EXPECT_EQ(plain.calls - plain0.calls, 1);
}

TEST(OpProfile, CategoryNames) {
  EXPECT_STREQ(op_category_name(OpCategory::kGemm), "gemm");
  EXPECT_STREQ(op_category_name(OpCategory::kNormElementwise), "norms and elementwise");
}

}  // namespace
}  // namespace megatron
