// FP8 scaling (parallel/fp8_scaling.h) and the FP8 Linear (parallel/linear.h), in one process.
//
// The recipes against hand-worked sequences (Transformer Engine's roll, amax choice, margin and
// the scale's special cases); the Linear's three GEMMs against an fp64 restatement built from the
// codec (core/fp8.h: quantise each operand as fp8(x s), multiply in fp64, apply 1 / (s_a s_b));
// the phases (amax recorded on training forwards and backwards, the weight quantised once per
// step, nothing recorded in evaluation or recomputation, recomputation with the forward's scales).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "parallel/fp8_scaling.h"
#include "parallel/linear.h"
#include "tensor/ops.h"
#include "testing/fp8_blocks.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using testing::random_tensor;

TEST(Fp8Scaling, DelayedUpdateRollsTheHistoryAndScalesAsTransformerEngine) {
  // One operand's column (stride 3, as a Linear's [len, 3] history) of length 4.
  std::vector<float> h(12, 0.0f);
  float scale = 1.0f;
  auto col = [&] { return std::vector<float>{h[0], h[3], h[6], h[9]}; };
  auto update = [&](float recorded, bool max_algo, int margin = 0) {
    h[0] = recorded;
    delayed_scaling_update(h.data(), 4, 3, &scale, 448.0f, margin, max_algo);
  };
  update(2.0f, false);  // [2,0,0,0] -> rows up, newest last, row 0 cleared
  EXPECT_EQ(col(), (std::vector<float>{0, 0, 0, 2}));
  EXPECT_EQ(scale, 224.0f);  // 448 / 2
  update(4.0f, false);
  EXPECT_EQ(col(), (std::vector<float>{0, 0, 2, 4}));
  EXPECT_EQ(scale, 112.0f);
  // No amax recorded (a weight cached on a later micro-batch): most_recent keeps the scale.
  update(0.0f, false);
  EXPECT_EQ(col(), (std::vector<float>{0, 2, 4, 0}));
  EXPECT_EQ(scale, 112.0f);
  // max: the window is the old column (the entry rolled out of row 1 included), here 4.
  update(1.0f, true);
  EXPECT_EQ(col(), (std::vector<float>{0, 4, 0, 1}));
  EXPECT_EQ(scale, 112.0f);
  // most_recent with a margin: 448 * 2^-2 / 1.
  update(1.0f, false, 2);
  EXPECT_EQ(scale, 112.0f);
  update(8.0f, false, 2);
  EXPECT_EQ(scale, 14.0f);
  // A non-finite amax keeps the scale; one whose quotient overflows gives FLT_MAX.
  update(INFINITY, false);
  EXPECT_EQ(scale, 14.0f);
  update(1e-39f, false);
  EXPECT_EQ(scale, FLT_MAX);
  // Length 1: row 0 is the whole history, cleared each time.
  float one = 3.5f, s1 = 1.0f;
  delayed_scaling_update(&one, 1, 1, &s1, 57344.0f, 0, false);
  EXPECT_EQ(one, 0.0f);
  EXPECT_EQ(s1, 57344.0f / 3.5f);
}

TEST(Fp8Scaling, CurrentScalingScaleAndItsSpecialCases) {
  EXPECT_EQ(current_scaling_scale(2.0, 448.0f, FLT_MAX), 224.0f);
  EXPECT_EQ(current_scaling_scale(0.0, 448.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(current_scaling_scale(INFINITY, 448.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(current_scaling_scale(NAN, 448.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(current_scaling_scale(1e-39, 448.0f, 7.0f), 7.0f);
}

// fp64 restatement: the operand quantised with `scale` through the codec, as f64 values.
Tensor quantised(const Tensor& x, float scale, Fp8Format f) {
  Tensor out = Tensor::empty(x.shape(), DType::kF64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = static_cast<float>(x.item(i)) * scale;
    out.data<double>()[i] = fp8_decode(fp8_encode(v, f), f);
  }
  return out;
}

// out[m, n] = sum_k a[m, k] b[n, k] (or a^T b with ta) / (sa sb), in fp64.
Tensor gemm64(const Tensor& a, bool ta, const Tensor& b, bool tb, double descale) {
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t n = tb ? b.dim(0) : b.dim(1);
  Tensor out = Tensor::zeros({m, n}, DType::kF64);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) {
        const double av = ta ? a.item(l * a.dim(1) + i) : a.item(i * k + l);
        const double bv = tb ? b.item(j * k + l) : b.item(l * n + j);
        s += av * bv;
      }
      out.data<double>()[i * n + j] = s * descale;
    }
  return out;
}

struct Fp8Linear {
  Linear lin;
  std::unique_ptr<ParamSet> params;
  Fp8GemmScaling* fp8 = nullptr;
  Fp8Region region;

  explicit Fp8Linear(Fp8Config cfg, int64_t in = 48, int64_t out = 24, DType dtype = DType::kF32)
      : lin("layer.fc", in, out, /*with_bias=*/true, 0.3) {
    params = std::make_unique<ParamSet>(std::vector<Param*>{&lin.weight, &lin.bias}, dtype);
    params->initialize(7);
    ops::add_inplace(lin.bias.main, random_tensor({out}, 8, 0.5, lin.bias.main.dtype()));
    params->sync_compute_from_main();
    params->zero_grads();
    fp8 = lin.enable_fp8(cfg, 0, 1);
    region.add(fp8);
  }
  float* scales() { return fp8->state()[0]->main.data<float>(); }
};

Fp8Config hybrid_delayed() {
  Fp8Config c;
  c.mode = Fp8Mode::kHybrid;
  return c;
}

// Tolerances: our GEMMs multiply the same FP8 values exactly (held in bf16) and sum 24-48 terms in
// f32; the restatement sums in f64. The sums differ by at most about K u sum|terms| (u = 2^-24,
// K <= 48), well under 1e-5 of the largest result: 1e-5 relative to it. A wrong scale, a value
// quantised with another format or an unscaled result is off by a factor or by FP8's 2^-4.
constexpr double kRel = 1e-5;

::testing::AssertionResult close_to(const Tensor& got, const Tensor& want) {
  double peak = 0;
  for (int64_t i = 0; i < want.numel(); ++i) peak = std::max(peak, std::fabs(want.item(i)));
  return testing::allclose(got.to(DType::kF64), want.view(got.shape()), kRel * peak, 0);
}

TEST(Fp8Linear, GemmsTakeQuantisedOperandsWithTheirScales) {
  for (bool wgrad : {true, false}) {
    Fp8Config cfg = hybrid_delayed();
    cfg.wgrad = wgrad;
    Fp8Linear f(cfg);
    // Scales that put the operands across the formats' ranges (inputs up to 2 x 150 = 300 of
    // E4M3's 448, weights near the subnormals, gradients in E5M2's upper range).
    const float sx = 150.0f, sw = 40.0f, sdy = 9000.0f;
    f.scales()[0] = sx;
    f.scales()[1] = sw;
    f.scales()[2] = sdy;
    const Tensor x = random_tensor({6, 48}, 1, 2.0), dy = random_tensor({6, 24}, 2, 3.0);
    f.region.begin_forward(/*training=*/true, /*first_micro_batch=*/true);
    Linear::Ctx ctx;
    const Tensor y = f.lin.forward(x, ctx);
    const Tensor qx = quantised(x, sx, Fp8Format::kE4M3);
    const Tensor qw = quantised(f.lin.weight.value, sw, Fp8Format::kE4M3);
    Tensor want = gemm64(qx, false, qw, true, 1.0 / sx / sw);
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < 24; ++c) want.data<double>()[r * 24 + c] += f.lin.bias.main.item(c);
    EXPECT_TRUE(close_to(y, want)) << "forward";
    f.region.begin_backward();
    const Tensor dx = f.lin.backward(dy, ctx);
    const Tensor qdy = quantised(dy, sdy, Fp8Format::kE5M2);  // hybrid: gradients in E5M2
    EXPECT_TRUE(close_to(dx, gemm64(qdy, false, qw, false, 1.0 / sdy / sw))) << "dgrad";
    const Tensor dw_want = wgrad ? gemm64(qdy, true, qx, false, 1.0 / sdy / sx)
                                 : gemm64(dy.to(DType::kF64), true, x.to(DType::kF64), false, 1);
    EXPECT_TRUE(close_to(f.lin.weight.main_grad, dw_want)) << "wgrad, fp8 " << wgrad;
    // The quantisation matters: the unquantised product differs by far more than the tolerance.
    EXPECT_FALSE(close_to(
        dx, gemm64(dy.to(DType::kF64), false, f.lin.weight.value.to(DType::kF64), false, 1)));
  }
}

TEST(Fp8Linear, DelayedScalingRecordsUpdatesAndCachesTheWeightPerStep) {
  Fp8Linear f(hybrid_delayed());
  const Tensor x1 = random_tensor({4, 48}, 3, 2.0), x2 = random_tensor({4, 48}, 4, 5.0);
  const Tensor dy = random_tensor({4, 24}, 5, 0.01);
  const float w_amax = static_cast<float>(ops::abs_max(f.lin.weight.value));
  // First micro-batch: input and weight amaxes recorded; the update gives 448 / amax.
  f.region.begin_forward(true, true);
  Linear::Ctx c1;
  f.lin.forward(x1, c1);
  const void* first_weight = c1.w8.q.raw();
  f.region.end_forward(true, nullptr);
  EXPECT_EQ(f.scales()[0], 448.0f / static_cast<float>(ops::abs_max(x1)));
  EXPECT_EQ(f.scales()[1], 448.0f / w_amax);
  // Backward: the gradient's amax, E5M2's 57344.
  f.region.begin_backward();
  f.lin.backward(dy, c1);
  f.region.end_backward(nullptr);
  EXPECT_EQ(f.scales()[2], 57344.0f / static_cast<float>(ops::abs_max(dy)));
  // Second micro-batch: the weight is the cached copy (not quantised, no amax: most_recent keeps
  // its scale) and still the copy quantised with the first micro-batch's scale (1).
  const float weight_scale = f.scales()[1];
  f.region.begin_forward(true, false);
  Linear::Ctx c2;
  f.lin.forward(x2, c2);
  EXPECT_EQ(c2.w8.scale_inv, 1.0f);
  EXPECT_EQ(c2.w8.q.raw(), first_weight);
  f.region.end_forward(true, nullptr);
  EXPECT_EQ(f.scales()[1], weight_scale);
  EXPECT_EQ(f.scales()[0], 448.0f / static_cast<float>(ops::abs_max(x2)));
  // Evaluation records nothing and quantises the weight afresh with the current scale.
  const std::vector<float> before(f.scales(), f.scales() + 3);
  f.region.begin_forward(false, false);
  Linear::Ctx c3;
  f.lin.forward(x1, c3);
  f.region.end_forward(false, nullptr);
  EXPECT_EQ(std::vector<float>(f.scales(), f.scales() + 3), before);
  EXPECT_EQ(c3.w8.scale_inv, 1.0f / weight_scale);
}

TEST(Fp8Registry, EveryRegionsEndRollsEveryEnrolledGemmAsTransformerEnginesGlobalBuffer) {
  // Two regions (Megatron's two fp8_autocast contexts on one rank) in one registry, history 4
  // with max. TE's history step (DelayedUpdateRollsTheHistory...): amax over the window, roll
  // left, row 0 cleared. A's [big, 0, 0, 0] -> [0, 0, 0, big] at its end; every later region end
  // rolls it again with a zero recorded (B's three: [0, 0, big, 0], [0, big, 0, 0], all zero),
  // so A's next input amax, a smaller one, is the whole window: 448 / small. Updating its own
  // GEMMs only, A's window would still hold big (448 / big).
  Fp8Config cfg = hybrid_delayed();
  cfg.amax_history_len = 4;
  cfg.amax_compute_max = true;
  Fp8Linear a(cfg), b(cfg);
  Fp8Registry registry;
  a.region.join(&registry);
  b.region.join(&registry);
  EXPECT_EQ(registry.size(), 2);  // enrolled when joined, before either ran
  const Tensor big = random_tensor({4, 48}, 11, 6.0), small = random_tensor({4, 48}, 12, 1.0);
  const float big_amax = static_cast<float>(ops::abs_max(big));
  const float small_amax = static_cast<float>(ops::abs_max(small));
  ASSERT_LT(small_amax, big_amax);
  auto step = [](Fp8Linear& f, const Tensor& x) {
    f.region.begin_forward(/*training=*/true, /*first_micro_batch=*/true);
    Linear::Ctx c;
    f.lin.forward(x, c);
    f.region.end_forward(true, nullptr);
  };
  auto history = [](const Fp8Linear& f) {  // [4][input, weight, grad]
    const float* h = f.fp8->state()[1]->main.data<float>();
    return std::vector<float>(h, h + 12);
  };
  step(a, big);
  EXPECT_EQ(a.scales()[0], 448.0f / big_amax);
  // B never ran: its all-zero history rolled by A's end stays all zero, its scales 1.
  EXPECT_EQ(history(b), std::vector<float>(12, 0.0f));
  EXPECT_EQ(b.scales()[0], 1.0f);
  for (int i = 0; i < 3; ++i) step(b, small);
  EXPECT_EQ(a.scales()[0], 448.0f / big_amax);  // big still in the window at each roll
  const std::vector<float> rolled = history(a);
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(rolled[r * 3], 0.0f) << "row " << r;
  step(a, small);
  EXPECT_EQ(a.scales()[0], 448.0f / small_amax);
  // The same steps with the regions alone keep big in A's window.
  Fp8Linear a2(cfg), b2(cfg);
  step(a2, big);
  for (int i = 0; i < 3; ++i) step(b2, small);
  step(a2, small);
  EXPECT_EQ(a2.scales()[0], 448.0f / big_amax);
}

TEST(Fp8Linear, RecomputationUsesTheForwardsScalesAndRecordsNothing) {
  Fp8Linear f(hybrid_delayed());
  const Tensor x = random_tensor({4, 48}, 6, 2.0);
  f.scales()[0] = 100.0f;
  f.region.begin_forward(true, true);
  const std::vector<float> saved = f.region.forward_scales();
  Linear::Ctx c1;
  const Tensor y1 = f.lin.forward(x, c1);
  f.region.end_forward(true, nullptr);  // scales move on (another micro-batch's update)
  ASSERT_NE(f.scales()[0], 100.0f);
  const std::vector<float> live(f.scales(), f.scales() + 3);
  const std::vector<float> history(f.fp8->state()[1]->main.data<float>(),
                                   f.fp8->state()[1]->main.data<float>() + 3);
  f.region.begin_backward();
  f.region.begin_recompute(saved);
  Linear::Ctx c2;
  const Tensor y2 = f.lin.forward(x, c2);
  f.region.end_recompute();
  EXPECT_TRUE(testing::allclose(y2, y1, 0, 0));  // bit for bit: the same operands
  EXPECT_EQ(std::vector<float>(f.scales(), f.scales() + 3), live);
  EXPECT_EQ(std::vector<float>(f.fp8->state()[1]->main.data<float>(),
                               f.fp8->state()[1]->main.data<float>() + 3),
            history);
}

TEST(Fp8Linear, TensorwiseScalesEachOperandByItsOwnAmax) {
  Fp8Config cfg;
  cfg.mode = Fp8Mode::kE4M3;
  cfg.recipe = Fp8Recipe::kTensorwise;
  Fp8Linear f(cfg);
  EXPECT_TRUE(f.fp8->state().empty());  // nothing carried across steps
  const Tensor x = random_tensor({5, 48}, 9, 3.0), dy = random_tensor({5, 24}, 10, 0.02);
  f.region.begin_forward(true, true);
  Linear::Ctx ctx;
  const Tensor y = f.lin.forward(x, ctx);
  const float sx = 448.0f / static_cast<float>(ops::abs_max(x));
  const float sw = 448.0f / static_cast<float>(ops::abs_max(f.lin.weight.value));
  const Tensor qx = quantised(x, sx, Fp8Format::kE4M3);
  const Tensor qw = quantised(f.lin.weight.value, sw, Fp8Format::kE4M3);
  Tensor want = gemm64(qx, false, qw, true, 1.0 / sx / sw);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 24; ++c) want.data<double>()[r * 24 + c] += f.lin.bias.main.item(c);
  EXPECT_TRUE(close_to(y, want));
  f.region.begin_backward();
  const Tensor dx = f.lin.backward(dy, ctx);
  const float sdy = 448.0f / static_cast<float>(ops::abs_max(dy));  // e4m3: gradients E4M3 too
  EXPECT_TRUE(
      close_to(dx, gemm64(quantised(dy, sdy, Fp8Format::kE4M3), false, qw, false, 1.0 / sdy / sw)));
}

// The block-scaled recipes' three GEMMs read each operand quantised along their own reduction
// dimension (TE's rowwise / columnwise usages): forward x (1 x B) by w (1 x B); input gradient
// dy (1 x B) by w (B x 1, or 128 x 128); weight gradient dy (B x 1) by x (B x 1). Sizes with
// several blocks and partial ones on every edge (MXFP8: 80 = 32 + 32 + 16 features, 72 outputs,
// 40 rows; blockwise: 160 features, 136 outputs, 136 rows). f64 operands and GEMMs: the products
// of the restated values are exact and the sums differ by order only (K 2^-53 relative, K <= 160):
// 1e-12 of the largest result. Reading an operand with the other usage changes many values by
// FP8's relative step (2^-4 for E4M3): far outside it, which the last check shows.
TEST(Fp8Linear, BlockScaledRecipesQuantiseEachOperandAlongItsGemmsReduction) {
  for (bool mx : {true, false}) {
    Fp8Config cfg;
    cfg.mode = Fp8Mode::kHybrid;
    cfg.recipe = mx ? Fp8Recipe::kMxfp8 : Fp8Recipe::kBlockwise;
    const int64_t in = mx ? 80 : 160, out = mx ? 72 : 136, rows = mx ? 40 : 136;
    const int64_t B = mx ? 32 : 128;
    Fp8Linear f(cfg, in, out, DType::kF64);
    // Magnitudes that change by powers of two from row to row and column to column, so that
    // a block along the rows and one along the columns take different scales (with values of
    // one spread, power-of-two scales would coincide and both usages quantise alike).
    auto graded = [](Tensor t) {
      for (int64_t r = 0; r < t.dim(0); ++r)
        for (int64_t c = 0; c < t.dim(1); ++c)
          t.data<double>()[r * t.dim(1) + c] *= std::ldexp(1.0, static_cast<int>(r % 4 + c % 3));
      return t;
    };
    const Tensor x = graded(random_tensor({rows, in}, 21, 2.0, DType::kF64));
    const Tensor dy = graded(random_tensor({rows, out}, 22, 0.01, DType::kF64));
    f.region.begin_forward(/*training=*/true, /*first_micro_batch=*/true);
    Linear::Ctx ctx;
    const Tensor y = f.lin.forward(x, ctx);
    f.region.end_forward(true, nullptr);
    const Tensor& w = f.lin.weight.value;
    const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
    const Tensor w_rows = testing::block_quantised(w, mx ? 1 : 128, mx ? B : 128, mx, e4);
    const Tensor w_cols = testing::block_quantised(w, mx ? B : 128, mx ? 1 : 128, mx, e4);
    Tensor want = gemm64(testing::block_quantised(x, 1, B, mx, e4), false, w_rows, true, 1.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < out; ++c) want.data<double>()[r * out + c] += f.lin.bias.main.item(c);
    auto close = [](const Tensor& got, const Tensor& expected) {
      double peak = 0;
      for (int64_t i = 0; i < expected.numel(); ++i)
        peak = std::max(peak, std::fabs(expected.item(i)));
      return testing::allclose(got.to(DType::kF64), expected.view(got.shape()), 1e-12 * peak, 0);
    };
    EXPECT_TRUE(close(y, want)) << "forward, mxfp8 " << mx;
    f.region.begin_backward();
    const Tensor dx = f.lin.backward(dy, ctx);
    f.region.end_backward(nullptr);
    EXPECT_TRUE(
        close(dx, gemm64(testing::block_quantised(dy, 1, B, mx, e5), false, w_cols, false, 1.0)))
        << "dgrad, mxfp8 " << mx;
    const Tensor x_cols = testing::block_quantised(x, B, 1, mx, e4);
    const Tensor dw_want =
        gemm64(testing::block_quantised(dy, B, 1, mx, e5), true, x_cols, false, 1.0);
    EXPECT_TRUE(close(f.lin.weight.main_grad, dw_want)) << "wgrad, mxfp8 " << mx;
    const Tensor dw_rowwise = gemm64(testing::block_quantised(dy, 1, B, mx, e5), true,
                                     testing::block_quantised(x, 1, B, mx, e4), false, 1.0);
    EXPECT_FALSE(close(f.lin.weight.main_grad, dw_rowwise)) << "the usages differ, mxfp8 " << mx;
    // A later micro-batch reads the step's copies of the weight (both usages); the next step's
    // first micro-batch quantises the updated weight afresh, the columnwise copy included.
    for (bool first : {false, true}) {
      if (first) ops::add_inplace(f.lin.weight.value, random_tensor(w.shape(), 23, 0.3, w.dtype()));
      f.region.begin_forward(true, first);
      Linear::Ctx c2;
      f.lin.forward(x, c2);
      f.region.end_forward(true, nullptr);
      f.region.begin_backward();
      const Tensor dx2 = f.lin.backward(dy, c2);
      f.region.end_backward(nullptr);
      const Tensor w2 =
          testing::block_quantised(f.lin.weight.value, mx ? B : 128, mx ? 1 : 128, mx, e4);
      EXPECT_TRUE(
          close(dx2, gemm64(testing::block_quantised(dy, 1, B, mx, e5), false, w2, false, 1.0)))
          << "dgrad, first micro-batch " << first << ", mxfp8 " << mx;
    }
  }
}

}  // namespace
}  // namespace megatron
