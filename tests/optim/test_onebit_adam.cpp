// 1-bit Adam (optim/onebit_adam.h) and its compressed all-reduce (comm/compressed_allreduce.h)
// under a real MPI job (np 2 and 4): the data-parallel group is the world.
//
//   - The compressed all-reduce leaves the same values on every rank, each element +-(a server's
//     scale); with error feedback the average of its outputs over many rounds of a constant input
//     approaches the true average (the errors carry what each round's signs lost); and it sends
//     about 1/32 of an f32 all-reduce's bytes, counted by the process group.
//   - 1-bit Adam's steps: the first moves nothing; warm-up steps equal an independent restatement
//     of Adam without bias correction on the all-reduced gradients; after the freeze step the
//     variance stays as it was, the replicas' weights stay identical although each rank feeds its
//     own gradient, and the data-parallel traffic of a step drops to the compressed exchange.
// Tolerances: the warm-up restatement runs the same f32 operations in the same order (exact).
// The error-feedback average: the errors telescope, so the mean over R rounds of a constant input
// differs from the true average by (mean worker error + server error) / R, elementwise; both
// errors stay within a few scales (~1 here): with R = 1000, 0.02 (measured 0.023 after 400
// rounds, 0.011 (2 ranks) and 0.007 (4) after 1000; without error feedback the outputs stay off by
// the sign quantisation, ~0.3 here).
#include <gtest/gtest.h>

#include <mpi.h>
#include "testing/mpi_testing.h"

#include <cmath>
#include <vector>

#include "comm/compressed_allreduce.h"
#include "comm/mpi_runtime.h"
#include "core/philox.h"
#include "optim/onebit_adam.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;

ProcessGroup& world() {
  return *g_runtime->world();
}

float uniform(int rank, int64_t i, uint64_t stream) {
  return static_cast<float>(2.0 * Philox::uniform(77 + rank, stream, static_cast<uint64_t>(i)) -
                            1.0);
}

TEST(CompressedAllreduce, SameOnEveryRankErrorFeedbackConvergesAndTrafficIsSmall) {
  ProcessGroup& g = world();
  const int W = g.size();
  const int64_t n = 1000;  // padded to a multiple of W lcm(W, 8): 1008 at W 2, 1024 at 4
  EXPECT_EQ(compressed_padded_size(n, W), W == 2 ? 1008 : 1024);
  std::vector<float> input(n), truth(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) input[i] = uniform(g.rank(), i, 1) + 0.3f * std::sin(0.01f * i);
  // The true average over ranks.
  Tensor sum = Tensor::empty({n}, DType::kF32);
  std::copy(input.begin(), input.end(), sum.data<float>());
  g.all_reduce(sum);
  for (int64_t i = 0; i < n; ++i) truth[i] = sum.data<float>()[i] / static_cast<float>(W);

  CompressionErrors errors = CompressionErrors::zeros(n, W);
  std::vector<double> mean(n, 0.0);
  const int rounds = 1000;
  int64_t compressed_bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<float> m = input;
    const int64_t before = g.bytes_sent();
    compressed_allreduce(m.data(), n, errors, g);
    compressed_bytes = g.bytes_sent() - before;
    for (int64_t i = 0; i < n; ++i) mean[i] += m[i] / rounds;
    if (r == 0) {
      // Identical on every rank: rank 0's values broadcast and compared.
      Tensor mine = Tensor::empty({n}, DType::kF32);
      std::copy(m.begin(), m.end(), mine.data<float>());
      Tensor root = mine.clone();
      g.broadcast(root, 0);
      int differ = 0;
      for (int64_t i = 0; i < n; ++i) differ += mine.data<float>()[i] != root.data<float>()[i];
      EXPECT_EQ(differ, 0);
      // Each element is +-(its server's scale): at most W distinct magnitudes.
      std::vector<float> magnitudes;
      for (int64_t i = 0; i < n; ++i) {
        const float a = std::fabs(m[i]);
        if (std::find(magnitudes.begin(), magnitudes.end(), a) == magnitudes.end())
          magnitudes.push_back(a);
      }
      EXPECT_LE(static_cast<int>(magnitudes.size()), W);
    }
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(mean[i] - truth[i]));
  EXPECT_LT(worst, 0.02) << "error feedback: the mean of " << rounds << " rounds";
  // The bytes against an f32 all-reduce of the same tensor: signs 1/32 of the floats, both ways.
  const int64_t before = g.bytes_sent();
  g.all_reduce(sum);
  const int64_t full = g.bytes_sent() - before;
  EXPECT_EQ(full, static_cast<int64_t>(2.0 * (W - 1) / W * 4 * n));
  const double ratio = static_cast<double>(compressed_bytes) / static_cast<double>(full);
  EXPECT_LT(ratio, 0.05) << compressed_bytes << " bytes against " << full;
  EXPECT_GT(ratio, 1.0 / 40);
}

struct Model {
  std::vector<Param> params = std::vector<Param>(3);
  std::unique_ptr<ParamSet> set;
  Model() {
    const int64_t sizes[] = {100, 37, 64};
    for (int i = 0; i < 3; ++i) {
      params[i].name = "p" + std::to_string(i);
      params[i].shape = {sizes[i]};
      params[i].init_std = 0.5;
      params[i].no_weight_decay = i == 1;
    }
    std::vector<Param*> ps;
    for (Param& p : params) ps.push_back(&p);
    set = std::make_unique<ParamSet>(ps, DType::kF32);
    set->initialize(5);
  }
  // This rank's gradient of step t: different on every rank, except the last 10 elements of p0,
  // which never get one (as padded vocabulary rows).
  void local_grads(int rank, int t) {
    float* g = set->grads().data<float>();
    for (int64_t i = 0; i < set->numel(); ++i) g[i] = uniform(rank, i, 100 + t) * 0.1f;
    const int64_t p0 = set->offset_of(params[0]);
    for (int64_t i = p0 + 90; i < p0 + 100; ++i) g[i] = 0.0f;
  }
};

TEST(OneBitAdam, WarmupIsAdamWithoutBiasCorrectionThenCompressedReplicasStayIdentical) {
  ProcessGroup& g = world();
  const int W = g.size();
  Model model;
  const AdamWConfig cfg{0.9, 0.999, 1e-8, 0.1};
  const int64_t freeze = 3;
  OneBitAdam opt(*model.set, cfg, freeze, g);
  const StepRates rates{1e-2, 1e-2, 0.1};
  const int64_t N = model.set->numel();
  // The restatement's state (the all-reduced gradients are the same on every rank).
  std::vector<float> w(model.set->main().data<float>(), model.set->main().data<float>() + N);
  std::vector<float> m(N, 0.0f), v(N, 0.0f);
  auto offset_of = [&](const Param& p) { return model.set->offset_of(p); };
  int64_t warm_bytes = 0, compressed_bytes = 0;
  for (int t = 1; t <= 6; ++t) {
    model.local_grads(g.rank(), t);
    const int64_t before = g.bytes_sent();
    const bool compressed = opt.compressing();
    EXPECT_EQ(compressed, t > freeze) << "step " << t;
    if (!compressed) {
      g.all_reduce(model.set->grads());  // the trainer's gradient buckets, averaged
      float* gr = model.set->grads().data<float>();
      for (int64_t i = 0; i < N; ++i) gr[i] /= static_cast<float>(W);
    }
    const std::vector<float> grads(model.set->grads().data<float>(),
                                   model.set->grads().data<float>() + N);
    opt.step(rates, 1.0);
    const int64_t bytes = g.bytes_sent() - before;
    (compressed ? compressed_bytes : warm_bytes) = bytes;
    const float* got = model.set->main().data<float>();
    if (t == 1) {
      for (int64_t i = 0; i < N; ++i) ASSERT_EQ(got[i], w[i]) << "the first step moves nothing";
      for (int64_t i = 0; i < N; ++i) ASSERT_EQ(opt.exp_avg().data<float>()[i], 0.0f);
      continue;
    }
    if (!compressed) {
      // Adam without bias correction, decoupled decay on the decayed parameters only.
      for (const Param& p : model.params) {
        const float wd = p.no_weight_decay ? 0.0f : 0.1f;
        for (int64_t i = offset_of(p); i < offset_of(p) + p.shape.numel(); ++i) {
          m[i] = 0.9f * m[i] + (1.0f - 0.9f) * grads[i];
          v[i] = 0.999f * v[i] + (1.0f - 0.999f) * grads[i] * grads[i];
          float update = m[i] / (std::sqrt(v[i]) + 1e-8f);
          if (wd > 0) update += wd * w[i];
          w[i] += -1e-2f * update;
        }
      }
      for (int64_t i = 0; i < N; ++i) ASSERT_EQ(got[i], w[i]) << "warm-up step " << t;
    } else {
      // The variance is frozen at the last warm-up step's.
      for (int64_t i = 0; i < N; ++i) ASSERT_EQ(opt.exp_avg_sq().data<float>()[i], v[i]);
      // Elements that never had a gradient keep a zero momentum (the mask from v = 0): only the
      // weight decay moves them, w -= lr wd w.
      const int64_t p0 = offset_of(model.params[0]);
      for (int64_t i = p0 + 90; i < p0 + 100; ++i) {
        ASSERT_EQ(v[i], 0.0f);
        ASSERT_EQ(opt.exp_avg().data<float>()[i], 0.0f) << "step " << t;
        w[i] += -1e-2f * (0.1f * w[i]);
        ASSERT_EQ(got[i], w[i]) << "step " << t;
      }
    }
    // The replicas agree bit for bit (the compressed momentum is the same everywhere).
    Tensor root = model.set->main().clone();
    g.broadcast(root, 0);
    int differ = 0;
    for (int64_t i = 0; i < N; ++i) differ += root.data<float>()[i] != got[i];
    EXPECT_EQ(differ, 0) << "step " << t;
  }
  // A warm-up step's traffic is the f32 gradient all-reduce; a compressed one's the 1-bit
  // exchange of each parameter's momentum, padded per tensor (W lcm(W, 8)): under 1/8 here, with
  // tensors of a few dozen elements whose scales weigh as much as their signs.
  EXPECT_EQ(warm_bytes, static_cast<int64_t>(2.0 * (W - 1) / W * 4 * N));
  EXPECT_LT(compressed_bytes * 8, warm_bytes) << compressed_bytes << " vs " << warm_bytes;
  // A checkpoint load restores the step count, the stage follows it.
  opt.set_steps(2);
  EXPECT_FALSE(opt.compressing());
  opt.set_steps(freeze);
  EXPECT_TRUE(opt.compressing());
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
