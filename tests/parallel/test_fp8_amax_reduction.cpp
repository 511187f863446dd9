// FP8 delayed scaling's amax reduction (parallel/fp8_scaling.h, Fp8Region) under a real MPI job:
// every rank records different amaxes, and after the region's end every rank's scales come from
// the group's maximum (Transformer Engine's all-reduce MAX over the amax reduction group), for
// the forward operands and the output gradient, every GEMM of the region in one reduction.
// Exact: the amaxes are small integers, their quotients rounded once as on every rank.
#include <gtest/gtest.h>

#include <mpi.h>
#include "testing/mpi_testing.h"

#include "comm/mpi_runtime.h"
#include "parallel/fp8_scaling.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;

TEST(Fp8AmaxReduction, EveryRankScalesByTheGroupMaximum) {
  ProcessGroup& world = *g_runtime->world();
  const int rank = world.rank(), size = world.size();
  Fp8Config cfg;
  cfg.mode = Fp8Mode::kHybrid;
  Fp8GemmScaling first("layers.0.fc", cfg, 0, 1), second("layers.1.fc", cfg, 0, 1);
  Fp8Region region;
  region.add(&first);
  region.add(&second);
  // Rank r's operands have amax r + 1 (first's input), 2 (size - r) (second's input), r + 3
  // (weights) and 10 (r + 1) (gradients): the maxima over ranks are size, 2 size, size + 2 and
  // 10 size, each held by a different rank.
  auto filled = [](double v) { return Tensor::full({4, 16}, v, DType::kF32); };
  region.begin_forward(/*training=*/true, /*first_micro_batch=*/true);
  first.quantize(filled(rank + 1), Fp8GemmScaling::kInput);
  second.quantize(filled(2.0 * (size - rank)), Fp8GemmScaling::kInput);
  first.weight(filled(rank + 3));
  second.weight(filled(rank + 3));
  region.end_forward(true, &world);
  region.begin_backward();
  first.quantize(filled(10.0 * (rank + 1)), Fp8GemmScaling::kGradOutput);
  second.quantize(filled(10.0 * (rank + 1)), Fp8GemmScaling::kGradOutput);
  region.end_backward(&world);
  auto scales = [](Fp8GemmScaling& g) { return g.state()[0]->main.data<float>(); };
  const float n = static_cast<float>(size);
  EXPECT_EQ(scales(first)[0], 448.0f / n);
  EXPECT_EQ(scales(second)[0], 448.0f / (2.0f * n));
  EXPECT_EQ(scales(first)[1], 448.0f / (n + 2.0f));
  EXPECT_EQ(scales(second)[1], 448.0f / (n + 2.0f));
  EXPECT_EQ(scales(first)[2], 57344.0f / (10.0f * n));
  EXPECT_EQ(scales(second)[2], 57344.0f / (10.0f * n));
  // The reduced amaxes went into the history (length 1: rolled into row 0 and cleared) and the
  // next update without new records keeps the scales (most_recent, amax 0).
  region.begin_forward(true, false);
  region.end_forward(true, &world);
  EXPECT_EQ(scales(first)[0], 448.0f / n);
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(
      runtime, megatron::testing::expected_world_size(argc, argv));
}
