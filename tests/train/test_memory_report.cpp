// The start-up "Theoretical memory footprints" line: bytes per parameter for each sharding, and
// FP8 primary weights' one-byte compute copy, frozen weights' main and compute copies alone.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "train/memory_report.h"

namespace megatron {
namespace {

double weight_mb(const std::string& line) {
  double mb = -1;
  std::sscanf(line.c_str(), "Theoretical memory footprints: weight and optimizer=%lf", &mb);
  return mb;
}

TEST(MemoryReport, BytesPerParameterAndFp8Codes) {
  const int64_t n = 1 << 20, dp = 4;  // 1 Mi parameters: bytes per parameter read as MB
  // bf16: 2 compute + 4 main + 4 grad + 8 moments; the distributed optimizer shards the moments
  // and the main weights (6 + 12/dp); ZeRO-3 shards everything (18/dp).
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kBF16, dp, {}, 0)), 18.0);
  const ShardedState zero1{true, true, false, false}, zero3{true, true, true, true};
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kBF16, dp, zero1, 0)), 9.0);
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kBF16, dp, zero3, 0)), 4.5);
  // FP8 primary weights: one byte less each (half of them under ZeRO-1: 8.5), 1/dp of that
  // under ZeRO-3 (all of them: 4.25; the line prints two decimals).
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kBF16, dp, zero1, 0, n / 2)), 8.5);
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kBF16, dp, zero3, 0, n)), 4.25);
  // fp32: no compute copy (the main weights are it).
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kF32, dp, {}, 0)), 16.0);
  // Frozen weights without gradients (--freeze-LM): 4 main + 2 compute bytes, whole, nothing
  // else; half of them frozen under ZeRO-1: 9 / 2 + 6 / 2 = 7.5.
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kBF16, dp, zero1, 0, 0, n / 2)),
                   7.5);
  EXPECT_DOUBLE_EQ(weight_mb(theoretical_memory_line(n, DType::kF32, dp, {}, 0, 0, n)), 4.0);
}

}  // namespace
}  // namespace megatron
