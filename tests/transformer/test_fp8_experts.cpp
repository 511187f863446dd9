// The MoE experts' FP8 GEMMs (transformer/moe/experts.h, Transformer Engine's GroupedLinear):
// each expert's block of rows is quantised with that expert's own scale (tensorwise here, so the
// scales follow from the data), its weights with theirs, and every grouped GEMM's output rows take
// their block's inverse scales. Checked against an fp64 restatement built from the codec
// (core/fp8.h), block by block, an empty block included; the activation between the GEMMs is
// taken from the layer's own context (an f32 GELU), so both sides quantise the same values.
//
// Tolerance: the FP8 values multiply exactly (held in bf16) and sum over K <= 64 terms in f32
// against the restatement's f64: at most about K 2^-24 sum|terms|, under 1e-5 of the largest
// result. A block quantised with another block's scale, or an output row descaled by the wrong
// block, is off by the ratio of two amaxes (tens of percent here: the blocks' ranges differ 4x).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/fp8.h"
#include "parallel/fp8_scaling.h"
#include "tensor/ops.h"
#include "testing/fp8_blocks.h"
#include "testing/testing.h"
#include "transformer/moe/experts.h"

namespace megatron {
namespace {

using testing::random_tensor;

// The rows [r0, r0 + n) of x [N, c] quantised with its own tensorwise scale: (values, 1 / s).
std::pair<std::vector<double>, double> block(const Tensor& x, int64_t r0, int64_t n, int64_t c,
                                             Fp8Format f) {
  double amax = 0;
  for (int64_t i = r0 * c; i < (r0 + n) * c; ++i) amax = std::max(amax, std::fabs(x.item(i)));
  const float s = amax > 0 ? fp8_max(f) / static_cast<float>(amax) : 1.0f;
  std::vector<double> q;
  for (int64_t i = r0 * c; i < (r0 + n) * c; ++i)
    q.push_back(fp8_decode(fp8_encode(static_cast<float>(x.item(i)) * s, f), f));
  return {q, 1.0 / s};
}

// out[r, j] = sum_k a[r, k] w[j, k] * descale, a: n x k, w: m x k.
std::vector<double> gemm_nt(const std::vector<double>& a, const std::vector<double>& w, int64_t n,
                            int64_t k, int64_t m, double descale) {
  std::vector<double> out(static_cast<size_t>(n * m), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += a[r * k + l] * w[j * k + l];
      out[r * m + j] = s * descale;
    }
  return out;
}

double peak(const std::vector<double>& v) {
  double p = 0;
  for (double x : v) p = std::max(p, std::fabs(x));
  return p;
}

// Rows [r0, r0 + n) of fc2's input as the layer computes it: the activation [N, f] (f32) times
// each row's probability, in f32.
Tensor scaled_rows(const Tensor& act, const std::vector<double>& probs, int64_t r0, int64_t n) {
  const int64_t f = act.dim(1);
  Tensor scaled = Tensor::empty({n, f}, DType::kF32);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < f; ++c)
      scaled.data<float>()[r * f + c] =
          act.data<float>()[(r0 + r) * f + c] * static_cast<float>(probs[r0 + r]);
  return scaled;
}

// Three experts (hidden 32, FP8 GEMMs in `mode` with `recipe`), their weights initialised and
// gradients zeroed, their GEMMs in one FP8 region.
struct Fp8ExpertsUnderTest {
  TransformerConfig cfg;
  decltype(make_self_process_group()) self = make_self_process_group();
  std::unique_ptr<GroupedExperts> layer;
  std::unique_ptr<ParamSet> params;
  Fp8Region region;

  Fp8ExpertsUnderTest(int64_t ffn, Fp8Mode mode, Fp8Recipe recipe) {
    cfg.num_layers = 1;
    cfg.hidden_size = 32;
    cfg.num_attention_heads = 4;
    cfg.seq_length = 8;
    cfg.vocab_size = 64;
    cfg.padded_vocab_size = 64;
    cfg.moe.num_experts = 3;
    cfg.moe.ffn_hidden_size = ffn;
    cfg.moe.router_topk = 2;
    cfg.add_bias_linear = false;
    cfg.fp8.mode = mode;
    cfg.fp8.recipe = recipe;
    cfg.finalize();
    layer = std::make_unique<GroupedExperts>("mlp.experts", cfg, 0, 1, *self);
    std::vector<Param*> ps;
    layer->collect(ps);
    params = std::make_unique<ParamSet>(ps, DType::kF32);
    params->initialize(3);
    params->zero_grads();
    for (Fp8GemmScaling* g : layer->enable_fp8(cfg.fp8)) region.add(g);
  }
};

TEST(Fp8Experts, EachExpertBlockIsQuantisedWithItsOwnScale) {
  Fp8ExpertsUnderTest t(16, Fp8Mode::kE4M3, Fp8Recipe::kTensorwise);
  GroupedExperts& experts = *t.layer;

  const int64_t h = 32, f = 16;
  const std::vector<int64_t> counts = {3, 0, 5};
  const int64_t N = 8;
  // Block 2's rows four times block 0's range: scales that differ by 4x.
  Tensor x = random_tensor({N, h}, 5, 1.0);
  for (int64_t i = 3 * h; i < N * h; ++i) x.data<float>()[i] *= 4.0f;
  std::vector<double> probs = {0.9, 0.5, 0.7, 0.2, 0.6, 1.0, 0.3, 0.8};
  GroupedExperts::Ctx ctx;
  const Tensor y = experts.forward(x, counts, probs, ctx);
  const Tensor act = ctx.act.clone();

  int64_t r0 = 0;
  for (int64_t g = 0; g < 3; ++g) {
    const int64_t n = counts[g];
    if (n == 0) continue;
    const auto [qx, x_inv] = block(x, r0, n, h, Fp8Format::kE4M3);
    const auto [qw1, w1_inv] = block(experts.fc1(g).value, 0, f, h, Fp8Format::kE4M3);
    const std::vector<double> pre = gemm_nt(qx, qw1, n, h, f, x_inv * w1_inv);
    for (size_t i = 0; i < pre.size(); ++i)
      ASSERT_NEAR(ctx.pre_act.item(r0 * f + static_cast<int64_t>(i)), pre[i], 1e-5 * peak(pre))
          << "fc1, expert " << g;
    // scaled = act * p in f32, as the layer computes it, then quantised with its block's scale.
    const Tensor scaled = scaled_rows(act, probs, r0, n);
    const auto [qs, s_inv] = block(scaled, 0, n, f, Fp8Format::kE4M3);
    const auto [qw2, w2_inv] = block(experts.fc2(g).value, 0, h, f, Fp8Format::kE4M3);
    const std::vector<double> out = gemm_nt(qs, qw2, n, f, h, s_inv * w2_inv);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(y.item(r0 * h + static_cast<int64_t>(i)), out[i], 1e-5 * peak(out))
          << "fc2, expert " << g;
    r0 += n;
  }

  // Backward: fc2's weight gradient of expert 2 from its quantised output gradient and input.
  const Tensor dy = random_tensor({N, h}, 6, 0.01);
  std::vector<double> dprobs;
  experts.backward(dy, ctx, &dprobs);
  const int64_t g = 2, n = counts[2], start = 3;
  const auto [qdy, dy_inv] = block(dy, start, n, h, Fp8Format::kE4M3);
  const Tensor scaled = scaled_rows(act, probs, start, n);
  const auto [qs, s_inv] = block(scaled, 0, n, f, Fp8Format::kE4M3);
  std::vector<double> dw2(static_cast<size_t>(h * f), 0.0);
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < f; ++j) {
      double s = 0;
      for (int64_t r = 0; r < n; ++r) s += qdy[r * h + i] * qs[r * f + j];
      dw2[i * f + j] = s * dy_inv * s_inv;
    }
  for (size_t i = 0; i < dw2.size(); ++i)
    ASSERT_NEAR(experts.fc2(g).main_grad.item(static_cast<int64_t>(i)), dw2[i], 1e-5 * peak(dw2))
        << "fc2 weight gradient, expert 2";
  // The empty expert's gradients stay zero.
  EXPECT_EQ(ops::sum_squares(experts.fc1(1).main_grad), 0.0);
  EXPECT_EQ(ops::sum_squares(experts.fc2(1).main_grad), 0.0);
}

// Rows [r0, r0 + n) of x [N, c] as a tensor of their own.
Tensor rows_of(const Tensor& x, int64_t r0, int64_t n) {
  const int64_t c = x.dim(1);
  return x.flat_view(r0 * c, {n, c}).clone();
}

// MXFP8 on the experts: every expert's rows quantised on their own, so the weight gradients'
// 32-row column blocks stop at each expert's last row (TE's GroupedLinear pads an expert's rows
// with zeros). Expert 0 has 40 rows (a full block and a partial one), expert 2 seven rows 2^16
// times larger: a column block running on from expert 0 into expert 2 would quantise expert 0's
// last 8 rows with expert 2's amax, which puts them among E4M3's subnormals (a power-of-two
// scale only changes values that leave the normal range, so a small ratio would not show).
// Checked: fc1's forward (rows in 1 x 32 blocks, the weight too) and fc2's weight gradient (output
// gradient and input in 32 x 1 blocks) of both experts, against tests/testing/fp8_blocks.h. The
// same tolerance as above (K <= 40 terms in f32).
TEST(Fp8Experts, Mxfp8ColumnBlocksStopAtEachExpertsRows) {
  Fp8ExpertsUnderTest t(32, Fp8Mode::kHybrid, Fp8Recipe::kMxfp8);
  GroupedExperts& experts = *t.layer;
  Fp8Region& region = t.region;

  const int64_t h = 32, f = 32, N = 47;
  const std::vector<int64_t> counts = {40, 0, 7}, starts = {0, 40, 40};
  Tensor x = random_tensor({N, h}, 5, 1.0);
  Tensor dy = random_tensor({N, h}, 6, 0.01);
  for (int64_t i = 40 * h; i < N * h; ++i) {
    x.data<float>()[i] *= 0x1p16f;
    dy.data<float>()[i] *= 0x1p16f;
  }
  std::vector<double> probs(N);
  for (int64_t r = 0; r < N; ++r) probs[r] = 0.3 + 0.01 * static_cast<double>(r);
  region.begin_forward(/*training=*/true, /*first_micro_batch=*/true);
  GroupedExperts::Ctx ctx;
  experts.forward(x, counts, probs, ctx);
  region.end_forward(true, nullptr);
  const Tensor act = ctx.act.clone(), pre_act = ctx.pre_act.clone();
  region.begin_backward();
  std::vector<double> dprobs;
  experts.backward(dy, ctx, &dprobs);
  region.end_backward(nullptr);

  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  for (int64_t g : {0, 2}) {
    const int64_t n = counts[g], r0 = starts[g];
    const Tensor qx = testing::block_quantised(rows_of(x, r0, n), 1, 32, true, e4);
    const Tensor qw1 = testing::block_quantised(experts.fc1(g).value, 1, 32, true, e4);
    std::vector<double> a(qx.data<double>(), qx.data<double>() + n * h),
        w(qw1.data<double>(), qw1.data<double>() + f * h);
    const std::vector<double> pre = gemm_nt(a, w, n, h, f, 1.0);
    for (size_t i = 0; i < pre.size(); ++i)
      ASSERT_NEAR(pre_act.item(r0 * f + static_cast<int64_t>(i)), pre[i], 1e-5 * peak(pre))
          << "fc1, expert " << g;
    const Tensor scaled = scaled_rows(act, probs, r0, n);
    const Tensor qs = testing::block_quantised(scaled, 32, 1, true, e4);
    const Tensor qdy = testing::block_quantised(rows_of(dy, r0, n), 32, 1, true, e5);
    std::vector<double> dw2(static_cast<size_t>(h * f), 0.0);
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < f; ++j) {
        double sum = 0;
        for (int64_t r = 0; r < n; ++r) sum += qdy.item(r * h + i) * qs.item(r * f + j);
        dw2[i * f + j] = sum;
      }
    for (size_t i = 0; i < dw2.size(); ++i)
      ASSERT_NEAR(experts.fc2(g).main_grad.item(static_cast<int64_t>(i)), dw2[i], 1e-5 * peak(dw2))
          << "fc2 weight gradient, expert " << g;
  }
}

}  // namespace
}  // namespace megatron
