// Every op of tensor/ops.h against its naive fp64 reference (tensor/reference/reference.h), at odd
// shapes, and every backward against central finite differences in fp64.
//
// Tolerances: fast-f64 vs reference-f64 differs only by summation order: 1e-10. Fast-f32 vs
// reference: inputs are O(1) and rows are short, so f32 rounding (6e-8 relative per op, growing
// with the length of a reduction) stays below 1e-5 relative; we use atol 2e-5, rtol 1e-4.
// Finite differences with step 1e-6 in fp64 are accurate to about 1e-8 on these smooth
// functions; we allow 1e-6.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cpu/vec_math.h"
#include "tensor/ops.h"
#include "tensor/reference/reference.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using testing::allclose;
using testing::fd_grad;
using testing::random_tensor;

constexpr double kF32Atol = 2e-5, kF32Rtol = 1e-4;
constexpr double kF64Tol = 1e-10;
constexpr double kFdTol = 1e-6;

Tensor f64(const Tensor& t) {
  return t.to(DType::kF64);
}

TEST(Matmul, AllTransposesF32AndF64MatchReference) {
  const int64_t m = 37, n = 29, k = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1);
      Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2);
      Tensor want = ref::matmul(f64(a), ta, f64(b), tb);
      Tensor c = Tensor::empty({m, n});
      ops::matmul(c, a, ta, b, tb);
      EXPECT_TRUE(allclose(c, want, kF32Atol * 10, kF32Rtol)) << "ta=" << ta << " tb=" << tb;
      Tensor c64 = Tensor::empty({m, n}, DType::kF64);
      ops::matmul(c64, f64(a), ta, f64(b), tb);
      EXPECT_TRUE(allclose(c64, want, kF64Tol, kF64Tol));
      // beta = 1 accumulates into the existing output.
      Tensor acc = Tensor::full({m, n}, 1.0);
      ops::matmul(acc, a, ta, b, tb, 1.0f);
      Tensor want_acc = want.clone();
      for (int64_t i = 0; i < want_acc.numel(); ++i) want_acc.data<double>()[i] += 1.0;
      EXPECT_TRUE(allclose(acc, want_acc, kF32Atol * 10, kF32Rtol));
    }
  }
}

TEST(Matmul, Bf16InputsAccumulateInF32) {
  // bf16 inputs are exact copies of bf16-rounded values; with f32 accumulation the only error is
  // f32 summation over k = 301 terms: well below 1e-4 relative to the O(sqrt(k)) result.
  const int64_t m = 19, n = 23, k = 301;
  Tensor a = random_tensor({m, k}, 3).to(DType::kBF16);
  Tensor b = random_tensor({n, k}, 4).to(DType::kBF16);
  Tensor want = ref::matmul(f64(a), false, f64(b), true);
  Tensor c = Tensor::empty({m, n});
  ops::matmul(c, a, false, b, true);
  EXPECT_TRUE(allclose(c, want, 1e-4, 1e-4));
}

// A few rows against a [n, k] weight (the skinny kernel under ops::matmul, the shape of decoding):
// every row count up to past the kernel's bounds, n off its 4-row blocks, k below, at and off the
// vector width, f32 and bf16, overwrite and accumulate. Tolerances as the two tests above: f32
// summation over k <= 300 terms of O(1) products.
TEST(Matmul, FewRowsMatchReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t m = 1; m <= 18; ++m) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {5, 16}, {37, 17}, {9, 300}}) {
        Tensor a = random_tensor({m, k}, 5).to(dt);
        Tensor b = random_tensor({n, k}, 6).to(dt);
        Tensor want = ref::matmul(f64(a), false, f64(b), true);
        Tensor c = Tensor::empty({m, n});
        ops::matmul(c, a, false, b, true);
        EXPECT_TRUE(allclose(c, want, 1e-4, 1e-4))
            << dtype_name(dt) << " m=" << m << " n=" << n << " k=" << k;
        Tensor acc = Tensor::full({m, n}, 1.0);
        ops::matmul(acc, a, false, b, true, 1.0f);
        for (int64_t i = 0; i < want.numel(); ++i) want.data<double>()[i] += 1.0;
        EXPECT_TRUE(allclose(acc, want, 1e-4, 1e-4))
            << dtype_name(dt) << " accumulate m=" << m << " n=" << n << " k=" << k;
      }
    }
  }
}

// Decoding's GEMMs give the same bits for any thread count and for a weight split by output rows
// (a column-parallel layer's shards), so that generation at TP 1 and 2 and with any
// --num-threads agrees exactly where the sums are the same.
TEST(Matmul, FewRowsSameBitsForThreadsAndColumnShards) {
  const int64_t m = 3, n = 70, k = 131;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor a = random_tensor({m, k}, 7).to(dt);
    Tensor b = random_tensor({n, k}, 8).to(dt);
    const int before = omp_get_max_threads();
    Tensor one = Tensor::empty({m, n}), three = Tensor::empty({m, n});
    omp_set_num_threads(1);
    ops::matmul(one, a, false, b, true);
    omp_set_num_threads(3);
    ops::matmul(three, a, false, b, true);
    omp_set_num_threads(before);
    EXPECT_EQ(std::memcmp(one.raw(), three.raw(), static_cast<size_t>(m * n) * 4), 0);
    const int64_t half = 33;  // off the kernel's 4-row blocks
    Tensor lo = Tensor::empty({m, half}), hi = Tensor::empty({m, n - half});
    ops::matmul(lo, a, false, b.slice0(0, half).clone(), true);
    ops::matmul(hi, a, false, b.slice0(half, n).clone(), true);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float got =
            j < half ? lo.data<float>()[i * half + j] : hi.data<float>()[i * (n - half) + j - half];
        ASSERT_EQ(got, one.data<float>()[i * n + j]) << dtype_name(dt) << " " << i << "," << j;
      }
    }
  }
}

// The grouped GEMMs in bf16 (the MoE experts' training dtype) and f32, with groups of several
// 128 x 512 blocks: against the fp64 reference (bf16 inputs are exact, so only f32 summation over
// k = 300 or 333 rows errs, as for matmul above), and bit-identical for 1 and 3 threads, since
// every block is one single-threaded GEMM of a fixed shape.
TEST(GroupedMatmul, Bf16AndF32MatchReferenceForAnyThreadCount) {
  const std::vector<int64_t> sizes = {300, 0, 33};
  const int64_t N = 333, k = 300, n = 600;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const Tensor a = random_tensor({N, k}, 5).to(dt), dy = random_tensor({N, n}, 6).to(dt);
    std::vector<Tensor> w;
    for (uint64_t g = 0; g < sizes.size(); ++g) w.push_back(random_tensor({n, k}, 7 + g).to(dt));
    auto run = [&](int threads) {
      const int before = omp_get_max_threads();
      omp_set_num_threads(threads);
      Tensor y = Tensor::empty({N, n});
      ops::grouped_matmul(y, a, w, true, sizes);
      std::vector<Tensor> dw;
      for (size_t g = 0; g < sizes.size(); ++g) dw.push_back(Tensor::full({n, k}, 1.0));
      ops::grouped_matmul_at(dw, dy, a, sizes);
      omp_set_num_threads(before);
      dw.insert(dw.begin(), y);
      return dw;
    };
    const std::vector<Tensor> one = run(1), three = run(3);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(allclose(one[i], three[i], 0, 0)) << i;
    int64_t at = 0;
    for (size_t g = 0; g < sizes.size(); ++g) {
      const Tensor ag = f64(a).slice0(at, at + sizes[g]);
      const Tensor want_y = ref::matmul(ag, false, f64(w[g]), true);
      EXPECT_TRUE(allclose(one[0].slice0(at, at + sizes[g]), want_y, 1e-4, 1e-4)) << g;
      const Tensor want_dw = ref::matmul(f64(dy).slice0(at, at + sizes[g]), true, ag, false);
      EXPECT_TRUE(allclose(one[1 + g], want_dw, 1e-4, 1e-4)) << g;  // zeroed for no rows
      at += sizes[g];
    }
  }
}

TEST(GroupedMatmul, RejectsSizesThatDoNotCoverTheRows) {
  const Tensor a = Tensor::zeros({5, 4});
  Tensor y = Tensor::zeros({5, 3});
  const std::vector<Tensor> w = {Tensor::zeros({3, 4}), Tensor::zeros({3, 4})};
  EXPECT_THROW(ops::grouped_matmul(y, a, w, true, {2, 2}), InvalidArgument);
  EXPECT_THROW(ops::grouped_matmul(y, a, w, true, {5}), InvalidArgument);
  EXPECT_THROW(ops::grouped_matmul(y, a, w, false, {2, 3}), InvalidArgument);
}

TEST(Matmul, RejectsMismatchedInnerDims) {
  Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({5, 6}), c = Tensor::zeros({3, 6});
  EXPECT_THROW(ops::matmul(c, a, false, b, false), InvalidArgument);
}

TEST(Elementwise, AddBiasAndScaleMatchReference) {
  // Exact in f32: each output element is one rounded add or multiply, computed the same way.
  Tensor a = random_tensor({7, 67}, 40), b = random_tensor({7, 67}, 41),
         bias = random_tensor({67}, 42);
  Tensor out = Tensor::empty(a.shape());
  ops::add(out, a, b);
  Tensor acc = a.clone();
  ops::add_inplace(acc, b);
  Tensor biased = a.clone();
  ops::bias_add(biased, bias);
  Tensor scaled = a.clone();
  ops::scale_inplace(scaled, 0.5);
  for (int64_t r = 0; r < 7; ++r) {
    for (int64_t j = 0; j < 67; ++j) {
      const int64_t i = r * 67 + j;
      const float x = a.data<float>()[i], y = b.data<float>()[i];
      ASSERT_EQ(out.data<float>()[i], x + y);
      ASSERT_EQ(acc.data<float>()[i], x + y);
      ASSERT_EQ(biased.data<float>()[i], x + bias.data<float>()[j]);
      ASSERT_EQ(scaled.data<float>()[i], x * 0.5f);
    }
  }
  // bias_backward sums over rows (here 3 x 7 = 21) and accumulates; 67 columns cross its
  // 64-column chunks. Against the fp64 column sums: 21 f32 additions, relative error < 1e-6.
  Tensor dy = random_tensor({3, 7, 67}, 43);
  Tensor db = Tensor::full({67}, 1.0);
  ops::bias_backward(db, dy);
  Tensor want = Tensor::full({67}, 1.0, DType::kF64);
  for (int64_t r = 0; r < 21; ++r)
    for (int64_t j = 0; j < 67; ++j) want.data<double>()[j] += dy.item(r * 67 + j);
  EXPECT_TRUE(allclose(db, want, 1e-6, 1e-6));
  Tensor wrong = Tensor::zeros({66});
  EXPECT_THROW(ops::bias_add(a, wrong), InvalidArgument);
}

TEST(Gelu, ExactAndTanhForwardBackward) {
  for (bool tanh_approx : {false, true}) {
    Tensor x = random_tensor({7, 13}, 5, 3.0);
    Tensor y = Tensor::empty(x.shape());
    ops::gelu_forward(y, x, tanh_approx);
    EXPECT_TRUE(allclose(y, ref::gelu(f64(x), tanh_approx), kF32Atol, kF32Rtol));
    Tensor dout = random_tensor(x.shape(), 6);
    Tensor dx = Tensor::empty(x.shape());
    ops::gelu_backward(dx, dout, x, tanh_approx);
    Tensor want = ref::gelu_backward(f64(dout), f64(x), tanh_approx);
    EXPECT_TRUE(allclose(dx, want, kF32Atol, kF32Rtol));
    Tensor fd =
        fd_grad([&](const Tensor& v) { return ref::gelu(v, tanh_approx); }, f64(x), f64(dout));
    EXPECT_TRUE(allclose(want, fd, kFdTol, kFdTol));
    // The fast kernel in f64 against finite differences too.
    Tensor dx64 = Tensor::empty(x.shape(), DType::kF64);
    ops::gelu_backward(dx64, f64(dout), f64(x), tanh_approx);
    EXPECT_TRUE(allclose(dx64, fd, kFdTol, kFdTol));
  }
}

// The fused bias + GELU gives the bits of the ops it replaces run one after another (bias_add,
// gelu_forward, a conversion to the 16-bit output), for either GELU, f32 and f64, and leaves the
// biased pre-activation in y, bit for bit. (Their accuracy against the f64 reference and finite
// differences is the plain ops' test above.)
TEST(BiasGelu, FusedGivesTheBitsOfTheOpsInSequence) {
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.numel() == b.numel() &&
           std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  for (const Shape& s :
       {Shape{1, 1}, Shape{3, 7}, Shape{5, 64}, Shape{33, 200}, Shape{2, 3, 130}}) {
    for (bool tanh_approx : {false, true}) {
      for (DType t : {DType::kF32, DType::kF64}) {
        const Tensor y = random_tensor(s, 40, 3.0).to(t), bias = random_tensor({s[-1]}, 42).to(t);
        Tensor pre = y.clone(), act = Tensor::empty(s, t);
        ops::bias_add(pre, bias);
        ops::gelu_forward(act, pre, tanh_approx);
        std::vector<DType> outs = {t};
        if (t == DType::kF32) outs = {t, DType::kBF16, DType::kF16};
        for (DType o : outs) {
          SCOPED_TRACE(s.str() + (tanh_approx ? " tanh " : " erf ") + dtype_name(t) + " -> " +
                       dtype_name(o));
          Tensor out = Tensor::empty(s, o), y2 = y.clone();
          ops::bias_gelu_forward(out, y2, bias, tanh_approx);
          EXPECT_TRUE(same_bits(out, act.to(o)));
          EXPECT_TRUE(same_bits(y2, pre));
        }
      }
    }
  }
  Tensor y = Tensor::zeros({2, 4}), b = Tensor::zeros({4}), bad_bias = Tensor::zeros({3});
  Tensor out16 = Tensor::empty({2, 4}, DType::kBF16), out = Tensor::empty({2, 4});
  Tensor y64 = y.to(DType::kF64);
  EXPECT_THROW(ops::bias_gelu_forward(out, y, bad_bias, false), InvalidArgument);
  EXPECT_THROW(ops::bias_gelu_forward(out16, y64, b.to(DType::kF64), false),
               InvalidArgument);  // 16-bit outputs are for f32 inputs
}

// An element's GELU gradient is the same whether a vectorised loop or its scalar remainder computes
// it (so the same for any thread count and row length): each value alone (a one-element call, the
// scalar code) against the same values in one long call (the vector code). Before the fma in
// gelu.h was written out, about one erf-GELU gradient in ten differed in its last bit.
TEST(Gelu, GradientIsTheSameInVectorAndScalarCode) {
  const int64_t n = 4096;
  const Tensor x = random_tensor({n}, 47, 3.0), dout = random_tensor({n}, 48);
  for (bool tanh_approx : {false, true}) {
    Tensor dx = Tensor::empty({n});
    ops::gelu_backward(dx, dout, x, tanh_approx);
    int differ = 0;
    for (int64_t i = 0; i < 512; ++i) {
      Tensor one = Tensor::empty({1});
      ops::gelu_backward(one, dout.slice0(i, i + 1).clone(), x.slice0(i, i + 1).clone(),
                         tanh_approx);
      differ += std::memcmp(one.raw(), dx.data<float>() + i, 4) != 0;
    }
    EXPECT_EQ(differ, 0) << (tanh_approx ? "tanh" : "erf");
  }
}

// The elementwise ops, the optimizer step and the norms give the same bits at any thread count:
// the threads' shares of a flat loop put each element in a vectorised body or a scalar remainder
// depending on the count, and the two must round alike (gelu.h's fma; this caught the GELU
// gradient). 7 x 301 elements: every share ends off the 16-wide vectors; 1, 2, 3 and 5 threads.
TEST(Elementwise, SameBitsForAnyThreadCount) {
  const Shape s{7, 301};
  const Tensor a = random_tensor(s, 49, 3.0), b = random_tensor(s, 50),
               c = random_tensor(s, 51, 0.1), bias = random_tensor({301}, 52);
  const Tensor glu = random_tensor({7, 602}, 53, 3.0), w = random_tensor({301}, 54);
  auto run_all = [&]() {
    std::vector<Tensor> outs;
    auto out = [&]() -> Tensor& { return outs.emplace_back(Tensor::empty(s)); };
    ops::add(out(), a, b);
    ops::mul(out(), a, b);
    outs.push_back(a.clone());
    ops::add_inplace(outs.back(), b);
    outs.push_back(a.clone());
    ops::scale_inplace(outs.back(), 0.37);
    for (bool tanh : {false, true}) {
      ops::gelu_forward(out(), a, tanh);
      ops::gelu_backward(out(), b, a, tanh);
      Tensor pre = a.clone();
      ops::bias_gelu_forward(out(), pre, bias, tanh);
    }
    ops::tanh_forward(out(), a);
    ops::tanh_backward(out(), b, c);
    ops::squared_relu_forward(out(), a);
    ops::squared_relu_backward(out(), b, a);
    ops::quick_gelu_forward(out(), a);
    ops::quick_gelu_backward(out(), b, a);
    ops::swiglu_forward(out(), glu);
    outs.push_back(Tensor::empty({7, 602}));
    ops::swiglu_backward(outs.back(), b, glu);
    ops::dropout_forward(out(), a, 0.3f, 5, 6);
    ops::dropout_backward(out(), b, 0.3f, 5, 6);
    Tensor mean = Tensor::empty({7}), rstd = Tensor::empty({7});
    ops::layernorm_forward(out(), mean, rstd, a, w, bias, 1e-5f);
    ops::rmsnorm_forward(out(), rstd, a, w, 1e-5f);
    Tensor p = a.clone(), m = c.clone(), v = c.clone();
    ops::mul(v, v, v);
    ops::adamw_step(p, m, v, b, ops::AdamWSpec{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3}, nullptr);
    outs.insert(outs.end(), {p, m, v});
    return outs;
  };
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> want = run_all();
  for (int threads : {2, 3, 5}) {
    omp_set_num_threads(threads);
    const std::vector<Tensor> got = run_all();
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes()), 0)
          << "output " << i << " at " << threads << " threads";
    }
  }
  omp_set_num_threads(before);
}

TEST(Swiglu, ForwardBackward) {
  Tensor x = random_tensor({5, 2 * 11}, 7, 2.0);
  Tensor y = Tensor::empty({5, 11});
  ops::swiglu_forward(y, x);
  EXPECT_TRUE(allclose(y, ref::swiglu(f64(x)), kF32Atol, kF32Rtol));
  Tensor dout = random_tensor({5, 11}, 8);
  Tensor dx = Tensor::empty(x.shape(), DType::kF64);
  ops::swiglu_backward(dx, f64(dout), f64(x));
  Tensor fd = fd_grad([&](const Tensor& v) { return ref::swiglu(v); }, f64(x), f64(dout));
  EXPECT_TRUE(allclose(dx, fd, kFdTol, kFdTol));
  EXPECT_TRUE(allclose(ref::swiglu_backward(f64(dout), f64(x)), fd, kFdTol, kFdTol));
}

TEST(LayerNorm, ForwardBackwardAndParamGrads) {
  const int64_t rows = 9, h = 37;
  Tensor x = random_tensor({3, 3, h}, 9, 2.0), w = random_tensor({h}, 10),
         b = random_tensor({h}, 11);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
  ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f);
  EXPECT_TRUE(allclose(y, ref::layernorm(f64(x), f64(w), f64(b), 1e-5), kF32Atol, kF32Rtol));

  Tensor x64 = f64(x), w64 = f64(w), b64 = f64(b),
         dout = random_tensor(x.shape(), 12, 1.0, DType::kF64);
  Tensor y64 = Tensor::empty(x.shape(), DType::kF64), m64 = Tensor::empty({rows}, DType::kF64),
         r64 = Tensor::empty({rows}, DType::kF64);
  ops::layernorm_forward(y64, m64, r64, x64, w64, b64, 1e-5f);
  Tensor dx = Tensor::empty(x.shape(), DType::kF64), dw = Tensor::zeros({h}, DType::kF64),
         db = Tensor::zeros({h}, DType::kF64);
  ops::layernorm_backward(dx, dw, db, dout, x64, w64, m64, r64);
  // eps as the kernel sees it: 1e-5 rounded to f32.
  const double eps = static_cast<double>(1e-5f);
  EXPECT_TRUE(allclose(
      dx, fd_grad([&](const Tensor& v) { return ref::layernorm(v, w64, b64, eps); }, x64, dout),
      kFdTol, kFdTol));
  EXPECT_TRUE(allclose(
      dw, fd_grad([&](const Tensor& v) { return ref::layernorm(x64, v, b64, eps); }, w64, dout),
      kFdTol, kFdTol));
  EXPECT_TRUE(allclose(
      db, fd_grad([&](const Tensor& v) { return ref::layernorm(x64, w64, v, eps); }, b64, dout),
      kFdTol, kFdTol));
  // Parameter gradients accumulate.
  ops::layernorm_backward(dx, dw, db, dout, x64, w64, m64, r64);
  auto g = ref::layernorm_backward(dout, x64, w64, eps);
  ops::scale_inplace(g.dweight, 2.0);
  EXPECT_TRUE(allclose(dw, g.dweight, 1e-9, 1e-9));
  // f32 backward against the reference.
  Tensor dx32 = Tensor::empty(x.shape()), dw32 = Tensor::zeros({h}), db32 = Tensor::zeros({h});
  ops::layernorm_backward(dx32, dw32, db32, dout.to(DType::kF32), x, w, mean, rstd);
  EXPECT_TRUE(allclose(dx32, g.dx, kF32Atol * 5, kF32Rtol));
  EXPECT_TRUE(allclose(db32, g.dbias, kF32Atol, kF32Rtol));
}

// Both norms write a 16-bit output (the next GEMM's input) as the f32 one rounded, bit for bit, and
// the same statistics.
TEST(LayerNorm, SixteenBitOutputIsTheF32OneRounded) {
  const Tensor x = random_tensor({5, 130}, 70, 2.0), w = random_tensor({130}, 71),
               b = random_tensor({130}, 72);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({5}), rstd = Tensor::empty({5});
  ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f);
  Tensor ry = Tensor::empty(x.shape()), rrstd = Tensor::empty({5});
  ops::rmsnorm_forward(ry, rrstd, x, w, 1e-5f);
  for (DType half : {DType::kBF16, DType::kF16}) {
    Tensor y16 = Tensor::empty(x.shape(), half), mean2 = Tensor::empty({5}),
           rstd2 = Tensor::empty({5});
    ops::layernorm_forward(y16, mean2, rstd2, x, w, b, 1e-5f);
    const Tensor want = y.to(half);
    EXPECT_EQ(std::memcmp(y16.raw(), want.raw(), want.nbytes()), 0) << dtype_name(half);
    EXPECT_TRUE(allclose(mean2, mean, 0, 0));
    EXPECT_TRUE(allclose(rstd2, rstd, 0, 0));
    Tensor r16 = Tensor::empty(x.shape(), half);
    ops::rmsnorm_forward(r16, rstd2, x, w, 1e-5f);
    const Tensor rwant = ry.to(half);
    EXPECT_EQ(std::memcmp(r16.raw(), rwant.raw(), rwant.nbytes()), 0) << dtype_name(half);
  }
}

TEST(RMSNorm, ForwardBackwardAndParamGrads) {
  const int64_t rows = 7, h = 29;
  Tensor x64 = random_tensor({rows, h}, 13, 2.0, DType::kF64),
         w64 = random_tensor({h}, 14, 1.0, DType::kF64);
  const double eps = static_cast<double>(1e-6f);
  Tensor y = Tensor::empty({rows, h}), rstd = Tensor::empty({rows});
  ops::rmsnorm_forward(y, rstd, x64.to(DType::kF32), w64.to(DType::kF32), 1e-6f);
  EXPECT_TRUE(allclose(y, ref::rmsnorm(x64, w64, eps), kF32Atol, kF32Rtol));
  Tensor dout = random_tensor({rows, h}, 15, 1.0, DType::kF64);
  Tensor y64 = Tensor::empty({rows, h}, DType::kF64), r64 = Tensor::empty({rows}, DType::kF64);
  ops::rmsnorm_forward(y64, r64, x64, w64, 1e-6f);
  Tensor dx = Tensor::empty({rows, h}, DType::kF64), dw = Tensor::zeros({h}, DType::kF64);
  ops::rmsnorm_backward(dx, dw, dout, x64, w64, r64);
  EXPECT_TRUE(
      allclose(dx, fd_grad([&](const Tensor& v) { return ref::rmsnorm(v, w64, eps); }, x64, dout),
               kFdTol, kFdTol));
  EXPECT_TRUE(
      allclose(dw, fd_grad([&](const Tensor& v) { return ref::rmsnorm(x64, v, eps); }, w64, dout),
               kFdTol, kFdTol));
  auto g = ref::rmsnorm_backward(dout, x64, w64, eps);
  EXPECT_TRUE(allclose(dx, g.dx, 1e-9, 1e-9));
}

TEST(Embedding, LookupAndDeterministicScatterAdd) {
  const int64_t vocab = 17, h = 70;  // h > 64 exercises two column chunks
  Tensor table = random_tensor({vocab, h}, 16);
  Tensor ids = testing::random_ids({5, 3}, 17, vocab);  // 15 tokens over 17 ids: repeats likely
  ids.data<int64_t>()[3] = ids.data<int64_t>()[0];      // and at least one for sure
  Tensor out = Tensor::empty({15, h});
  ops::embedding_forward(out, ids, table);
  EXPECT_TRUE(allclose(out, ref::embedding(ids, f64(table)), 0, 0));
  Tensor dout = random_tensor({15, h}, 18);
  Tensor dt = Tensor::zeros({vocab, h});
  ops::embedding_backward(dt, dout, ids);
  EXPECT_TRUE(allclose(dt, ref::embedding_backward(f64(dout), ids, vocab), kF32Atol, kF32Rtol));
  Tensor bad = Tensor::full({2}, 0.0, DType::kI64);
  bad.data<int64_t>()[1] = vocab;
  Tensor out2 = Tensor::empty({2, h});
  EXPECT_THROW(ops::embedding_forward(out2, bad, table), InvalidArgument);
}

TEST(Rope, MatchesReferenceAndInverseUndoes) {
  // [s, b, G, P, hn] with the packed-QKV use: rotate the first qpg + 1 heads of each group.
  const int64_t s = 11, b = 2, G = 2, P = 4, hn = 12;
  ops::RopeSpec spec{0, 3, 8, 10000.0f};  // partial rotary: 8 of 12 channels
  Tensor x = random_tensor({s, b, G, P, hn}, 19);
  Tensor y = x.clone();
  ops::rope_inplace(y, Tensor(), spec, false);
  EXPECT_TRUE(allclose(y, ref::rope(f64(x), Tensor(), spec, false), kF32Atol, kF32Rtol));
  ops::rope_inplace(y, Tensor(), spec, true);
  EXPECT_TRUE(allclose(y, x, 1e-5, 1e-5));
  // Backward of a rotation is the inverse rotation: check by finite differences.
  Tensor x64 = f64(x), dout = random_tensor(x.shape(), 20, 1.0, DType::kF64);
  Tensor dx = dout.clone();
  ops::rope_inplace(dx, Tensor(), spec, true);
  EXPECT_TRUE(allclose(
      dx, fd_grad([&](const Tensor& v) { return ref::rope(v, Tensor(), spec, false); }, x64, dout),
      kFdTol, kFdTol));
  // Explicit positions.
  Tensor pos = Tensor::empty({s, b}, DType::kI64);
  for (int64_t i = 0; i < s * b; ++i) pos.data<int64_t>()[i] = (i * 7) % 5;
  Tensor z = x.clone();
  ops::rope_inplace(z, pos, spec, false);
  EXPECT_TRUE(allclose(z, ref::rope(f64(x), pos, spec, false), kF32Atol, kF32Rtol));
}

TEST(CrossEntropy, VocabularyBlocksCombineToTheWholeOp) {
  // Two blocks of 24 columns (the second with 15 valid: vocabulary 39 of 48), combined the way
  // parallel/vocab_parallel.cpp combines them over ranks (max, then summed exp-sums and target
  // logits), against the one-block op: the same per-row terms, so equal within the rounding of
  // the two-way exp-sum (1e-6 relative), and the backward blocks equal the whole op's columns.
  const int64_t n = 5, block = 24, vocab = 39;
  Tensor logits = random_tensor({n, 2 * block}, 26, 4.0);
  Tensor targets = testing::random_ids({n}, 27, vocab);
  Tensor loss = Tensor::empty({n}), lse = Tensor::empty({n});
  ops::cross_entropy_forward(loss, lse, logits, targets, vocab);
  Tensor left = Tensor::empty({n, block}), right = Tensor::empty({n, block});
  ops::slice_last_dim(left, logits, 0);
  ops::slice_last_dim(right, logits, block);
  Tensor m0 = Tensor::empty({n}), m1 = Tensor::empty({n});
  ops::cross_entropy_shard_max(m0, left, block);
  ops::cross_entropy_shard_max(m1, right, vocab - block);
  Tensor m = Tensor::empty({n});
  for (int64_t r = 0; r < n; ++r)
    m.data<float>()[r] = std::max(m0.data<float>()[r], m1.data<float>()[r]);
  Tensor s0 = Tensor::empty({2 * n}, DType::kF64), s1 = Tensor::empty({2 * n}, DType::kF64);
  ops::cross_entropy_shard_sums(s0, left, m, targets, 0, block);
  ops::cross_entropy_shard_sums(s1, right, m, targets, block, vocab - block);
  ops::add_inplace(s0, s1);
  Tensor loss2 = Tensor::empty({n}), lse2 = Tensor::empty({n});
  ops::cross_entropy_shard_finish(loss2, lse2, m, s0);
  EXPECT_TRUE(allclose(loss2, loss, 1e-6, 1e-6));
  EXPECT_TRUE(allclose(lse2, lse, 1e-6, 1e-6));
  Tensor dloss = random_tensor({n}, 28);
  Tensor dwhole = Tensor::empty(logits.shape());
  ops::cross_entropy_backward(dwhole, dloss, logits, lse, targets, vocab);
  Tensor d0 = Tensor::empty({n, block}), d1 = Tensor::empty({n, block});
  ops::cross_entropy_shard_backward(d0, dloss, left, lse, targets, 0, block);
  ops::cross_entropy_shard_backward(d1, dloss, right, lse, targets, block, vocab - block);
  Tensor joined = Tensor::empty(logits.shape());
  ops::concat_last_dim(joined, {d0, d1});
  EXPECT_TRUE(allclose(joined, dwhole, 0, 0));  // the same kernel on the same inputs
}

TEST(MaskedSum, RowOrderInDouble) {
  Tensor loss = random_tensor({3, 4}, 29, 5.0), mask = random_tensor({3, 4}, 30);
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<float>()[i] = mask.item(i) > 0 ? 1.0f : 0.0f;
  const ops::MaskedSum got = ops::masked_sum(loss, mask);
  double sum = 0, count = 0;
  for (int64_t i = 0; i < loss.numel(); ++i) {
    sum += loss.item(i) * mask.item(i);
    count += mask.item(i);
  }
  EXPECT_EQ(got.sum, sum);  // the same products added in the same order
  EXPECT_EQ(got.count, count);
  EXPECT_THROW(ops::masked_sum(loss, Tensor::zeros({5})), InvalidArgument);
}

TEST(Layout, TransposeSliceAndConcatAreExactForEveryDtype) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kI64, DType::kI32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random_tensor({3, 7}, 31, 10.0).to(dt);
    Tensor t = Tensor::empty({7, 3}, dt);
    ops::transpose_2d(t, x);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 7; ++c) EXPECT_EQ(t.item(c * 3 + r), x.item(r * 7 + c));
    Tensor a = Tensor::empty({3, 2}, dt), b = Tensor::empty({3, 5}, dt),
           back = Tensor::empty({3, 7}, dt);
    ops::slice_last_dim(a, x, 0);
    ops::slice_last_dim(b, x, 2);
    ops::concat_last_dim(back, {a, b});
    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(back.item(i), x.item(i));
    Tensor too_wide = Tensor::empty({3, 6}, dt);
    EXPECT_THROW(ops::slice_last_dim(too_wide, x, 2), InvalidArgument);
  }
}

TEST(Layout, FillGivesEveryElementTheConvertedValue) {
  // The 16-bit and integer fills convert once and repeat the bytes: every element, the last
  // included, holds what one conversion of the value gives (1/3 rounds in bf16 and f16; -7.6
  // truncates toward zero in the integer types).
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64}) {
    SCOPED_TRACE(dtype_name(dt));
    for (double value : {1.0 / 3.0, -7.6, 0.0}) {
      // f64 keeps the double; every other type is filled from its f32 rounding.
      const float v = static_cast<float>(value);
      Tensor one = Tensor::empty({1}, dt);
      if (dt == DType::kF64)
        convert(one.raw(), dt, &value, DType::kF64, 1);
      else
        convert(one.raw(), dt, &v, DType::kF32, 1);
      const Tensor t = Tensor::full({5, 13}, value, dt);
      for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.item(i), one.item(0)) << i;
    }
  }
  EXPECT_EQ(Tensor::full({0}, 2.0, DType::kBF16).numel(), 0);
}

TEST(Layout, ZeroClearsEveryByteOfALargeBuffer) {
  // Past 4 MB the host zeroes one page-aligned range per thread: an odd size (1234567 floats)
  // leaves a short last range, and nothing outside the tensor's bytes may be touched.
  Tensor big = Tensor::full({1234567 + 2}, 1.0, DType::kF32);
  Tensor t = big.flat_view(1, {1234567});
  t.zero();
  const float* p = big.data<float>();
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[1234567 + 1], 1.0f);
  int64_t nonzero = 0;
  for (int64_t i = 1; i <= 1234567; ++i) nonzero += p[i] != 0.0f;
  EXPECT_EQ(nonzero, 0);
}

TEST(Embedding, VocabularyBlocksLookUpAndScatterOnlyTheirRows) {
  // Rows [4, 8) of a 12-row table: ids outside give zero rows and no gradient; inside, the
  // whole op's rows and gradients exactly.
  const int64_t h = 5;
  Tensor table = random_tensor({12, h}, 32);
  Tensor shard = table.slice0(4, 8).clone();
  Tensor ids = Tensor::empty({6}, DType::kI64);
  const int64_t id_values[] = {0, 4, 7, 7, 11, 5};
  std::copy(id_values, id_values + 6, ids.data<int64_t>());
  Tensor whole = Tensor::empty({6, h}), part = Tensor::empty({6, h});
  ops::embedding_forward(whole, ids, table);
  ops::embedding_forward_shard(part, ids, shard, 4);
  for (int64_t i = 0; i < 6; ++i) {
    const bool mine = id_values[i] >= 4 && id_values[i] < 8;
    for (int64_t j = 0; j < h; ++j)
      EXPECT_EQ(part.item(i * h + j), mine ? whole.item(i * h + j) : 0.0) << i << "," << j;
  }
  Tensor dout = random_tensor({6, h}, 33);
  Tensor dtable = Tensor::zeros({12, h}), dshard = Tensor::zeros({4, h});
  ops::embedding_backward(dtable, dout, ids);
  ops::embedding_backward_shard(dshard, dout, ids, 4);
  EXPECT_TRUE(allclose(dshard, dtable.slice0(4, 8), 0, 0));
}

// A 16-bit dlogits (a bf16 output layer's GEMM input) gets the f32 gradient's values rounded, bit
// for bit, whole and per vocabulary block, with padding columns, rows longer than the kernel's
// 1024-column chunks and targets in any chunk.
TEST(CrossEntropy, BackwardIntoA16BitGradientRoundsTheF32One) {
  const int64_t n = 6, padded = 2200, vocab = 2100;
  const Tensor logits = random_tensor({n, padded}, 60, 4.0), dloss = random_tensor({n}, 61);
  Tensor targets = Tensor::empty({n}, DType::kI64);
  const int64_t ids[n] = {0, 1023, 1024, 2047, 2099, 5};
  for (int64_t r = 0; r < n; ++r) targets.data<int64_t>()[r] = ids[r];
  Tensor loss = Tensor::empty({n}), lse = Tensor::empty({n});
  ops::cross_entropy_forward(loss, lse, logits, targets, vocab);
  Tensor want = Tensor::empty({n, padded});
  ops::cross_entropy_backward(want, dloss, logits, lse, targets, vocab);
  for (DType half : {DType::kBF16, DType::kF16}) {
    Tensor got = Tensor::empty({n, padded}, half);
    ops::cross_entropy_backward(got, dloss, logits, lse, targets, vocab);
    const Tensor rounded = want.to(half);
    EXPECT_EQ(std::memcmp(got.raw(), rounded.raw(), got.nbytes()), 0) << dtype_name(half);
    // One block of a split vocabulary (columns [1100, 2200), 1000 of them real tokens).
    const int64_t start = 1100, block = padded - start;
    Tensor shard = Tensor::empty({n, block}), wide = Tensor::empty({n, block});
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(shard.data<float>() + r * block, logits.data<float>() + r * padded + start,
                  static_cast<size_t>(block) * 4);
    Tensor got_block = Tensor::empty({n, block}, half);
    ops::cross_entropy_shard_backward(wide, dloss, shard, lse, targets, start, vocab - start);
    ops::cross_entropy_shard_backward(got_block, dloss, shard, lse, targets, start, vocab - start);
    const Tensor wide_rounded = wide.to(half);
    EXPECT_EQ(std::memcmp(got_block.raw(), wide_rounded.raw(), got_block.nbytes()), 0);
  }
  Tensor f64_out = Tensor::empty({n, padded}, DType::kF64);
  EXPECT_THROW(ops::cross_entropy_backward(f64_out, dloss, logits, lse, targets, vocab),
               InvalidArgument);
}

TEST(CrossEntropy, MaskedPaddingForwardBackward) {
  const int64_t n = 6, vp = 40, vocab = 33;  // 7 padding columns
  Tensor logits = random_tensor({n, vp}, 23, 4.0);
  // Padding columns hold large values: they must not leak into the softmax.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = vocab; j < vp; ++j) logits.data<float>()[r * vp + j] = 50.0f;
  Tensor targets = testing::random_ids({n}, 24, vocab);
  Tensor loss = Tensor::empty({n}), lse = Tensor::empty({n});
  ops::cross_entropy_forward(loss, lse, logits, targets, vocab);
  EXPECT_TRUE(allclose(loss, ref::cross_entropy(f64(logits), targets, vocab), kF32Atol, kF32Rtol));
  Tensor dloss = random_tensor({n}, 25);
  Tensor dlogits = logits.clone();  // in place over a copy of the logits
  ops::cross_entropy_backward(dlogits, dloss, dlogits, lse, targets, vocab);
  Tensor want = ref::cross_entropy_backward(f64(dloss), f64(logits), targets, vocab);
  EXPECT_TRUE(allclose(dlogits, want, kF32Atol, kF32Rtol));
  Tensor fd = fd_grad([&](const Tensor& v) { return ref::cross_entropy(v, targets, vocab); },
                      f64(logits), f64(dloss));
  EXPECT_TRUE(allclose(want, fd, kFdTol, kFdTol));
  Tensor lp = Tensor::empty({n});
  ops::log_softmax_gather(lp, logits, targets, vocab);
  for (int64_t r = 0; r < n; ++r) EXPECT_NEAR(lp.item(r), -loss.item(r), 1e-5);
  Tensor bad = targets.clone();
  bad.data<int64_t>()[0] = vocab;  // a padding id is never a valid target
  EXPECT_THROW(ops::cross_entropy_forward(loss, lse, logits, bad, vocab), InvalidArgument);
}

TEST(AdamW, MatchesReferenceOverSteps) {
  const int64_t n = 1001;
  Tensor p = random_tensor({n}, 26), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  ref::AdamState st{f64(p), Tensor::zeros({n}, DType::kF64), Tensor::zeros({n}, DType::kF64)};
  for (int64_t step = 1; step <= 5; ++step) {
    Tensor g = random_tensor({n}, 100 + static_cast<uint64_t>(step));
    ops::AdamWSpec spec{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    ops::adamw_step(p, m, v, g, spec);
    st = ref::adamw(st, f64(g), spec);
  }
  EXPECT_TRUE(allclose(p, st.param, 1e-6, 1e-5));
  EXPECT_TRUE(allclose(v, st.exp_avg_sq, 1e-7, 1e-5));

  // A grad_scale (fused clipping) gives exactly the step on gradients scaled in place first.
  Tensor g = random_tensor({n}, 200);
  Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone(), before = p.clone();
  ops::AdamWSpec spec{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 6};
  spec.grad_scale = 0.37;
  ops::adamw_step(p, m, v, g, spec);
  Tensor scaled = g.clone();
  ops::scale_inplace(scaled, spec.grad_scale);
  spec.grad_scale = 1.0;
  ops::adamw_step(p2, m2, v2, scaled, spec);
  EXPECT_TRUE(allclose(p, p2, 0, 0));
  EXPECT_TRUE(allclose(v, v2, 0, 0));
  EXPECT_FALSE(allclose(p, before, 0, 0));  // the step did move the weights
  spec.grad_scale = 0.37;
  st = ref::adamw(st, f64(g), spec);
  EXPECT_TRUE(allclose(p, st.param, 1e-6, 1e-5));  // the reference scales the same way
}

// emerging_optimizers' Lion on numbers worked by hand (both lerp forms, sign 0), then the clipping
// factor, the rounded compute copy and a short moment refused.
TEST(Lion, RuleByHand) {
  // p = 1, m = 0, g = 0.5, lr 0.125, wd 0.25, betas (0.75, 0.5), each a fused multiply-add:
  //   decay: p = 1 - 0.03125 = 0.96875; u = 0 + 0.25 (0.5 - 0) = 0.125 > 0: p = 0.84375;
  //   m = 0.5 - (0.5 - 0)(1 - 0.5) = 0.25 (beta2's weight 0.5: the second lerp form)
  // step 2 with g = -1: decay: p = 0.84375 - 0.0263671875 = 0.8173828125;
  //   u = 0.25 + 0.25 (-1 - 0.25) = -0.0625 < 0: p = 0.9423828125; m = -1 + 1.25 x 0.5 = -0.375
  // (every value exact in f32).
  Tensor p = Tensor::full({1}, 1.0), m = Tensor::zeros({1});
  // lerp weights 1 - beta: 0.25 and 0.5; decay -lr wd = -0.03125.
  const ops::LionSpec spec{0.125f, 0.25f, 0.5f, -0.03125f, 1.0};
  ops::lion_step(p, m, Tensor::full({1}, 0.5), spec);
  EXPECT_EQ(p.item(0), 0.84375);
  EXPECT_EQ(m.item(0), 0.25);
  ops::lion_step(p, m, Tensor::full({1}, -1.0), spec);
  EXPECT_EQ(p.item(0), 0.9423828125);
  EXPECT_EQ(m.item(0), -0.375);
  // A zero update (moment and gradient 0) moves the weight by its decay alone.
  Tensor q = Tensor::full({1}, 2.0), z = Tensor::zeros({1});
  ops::lion_step(q, z, Tensor::zeros({1}), spec);
  EXPECT_EQ(q.item(0), 2.0 - 2.0 * 0.125 * 0.25);

  const int64_t n = 4099;
  Tensor w = random_tensor({n}, 41), mm = random_tensor({n}, 42), gg = random_tensor({n}, 43);
  // The clipping factor gives exactly the step on gradients scaled in place first.
  Tensor w1 = w.clone(), m1 = mm.clone(), w2 = w.clone(), m2 = mm.clone();
  ops::lion_step(w1, m1, gg, ops::LionSpec{1e-2f, 0.1f, 0.01f, -1e-3f, 0.37});
  Tensor scaled = gg.clone();
  ops::scale_inplace(scaled, 0.37);
  ops::lion_step(w2, m2, scaled, ops::LionSpec{1e-2f, 0.1f, 0.01f, -1e-3f, 1.0});
  EXPECT_TRUE(allclose(w1, w2, 0, 0));
  EXPECT_TRUE(allclose(m1, m2, 0, 0));
  EXPECT_FALSE(allclose(w1, w, 0, 0));
  for (DType half : {DType::kBF16, DType::kF16}) {
    Tensor w5 = w.clone(), m5 = mm.clone(), w6 = w.clone(), m6 = mm.clone();
    Tensor rounded = Tensor::empty({n}, half);
    const ops::LionSpec s{1e-2f, 0.1f, 0.01f, -1e-3f, 1.0};
    ops::lion_step(w5, m5, gg, s, &rounded);
    ops::lion_step(w6, m6, gg, s);
    EXPECT_TRUE(allclose(w5, w6, 0, 0));
    const Tensor want = w6.to(half);
    EXPECT_EQ(std::memcmp(rounded.raw(), want.raw(), static_cast<size_t>(n) * 2), 0)
        << dtype_name(half);
  }
  Tensor short_m = Tensor::zeros({n - 1});
  EXPECT_THROW(ops::lion_step(w, short_m, gg, ops::LionSpec{}), InvalidArgument);
}

// torch.optim.SGD's rule (momentum, dampening 0, L2 decay) on numbers worked by hand, then over
// steps against the f64 device, fused clipping, no buffer, and the rounded compute copy.
TEST(Sgd, TorchRuleByHandAndOverSteps) {
  // p = 1, g = 0.5, wd 0.25, momentum 0.5, lr 0.125:
  //   step 1: d = 0.5 + 0.25 = 0.75, buf = 0.75, p = 1 - 0.09375 = 0.90625
  //   step 2 (g = 0.5): d = 0.5 + 0.2265625 = 0.7265625, buf = 0.375 + 0.7265625 = 1.1015625,
  //           p = 0.90625 - 0.1376953125 = 0.7685546875 (every value exact in f32)
  Tensor p = Tensor::full({1}, 1.0), buf = Tensor::zeros({1}), g = Tensor::full({1}, 0.5);
  ops::SgdSpec spec{0.125f, 0.5f, 0.25f, true, 1.0};
  ops::sgd_step(p, buf, g, spec);
  EXPECT_EQ(p.item(0), 0.90625);
  EXPECT_EQ(buf.item(0), 0.75);
  spec.first = false;
  ops::sgd_step(p, buf, g, spec);
  EXPECT_EQ(buf.item(0), 1.1015625);
  EXPECT_EQ(p.item(0), 0.7685546875);

  const int64_t n = 4099;  // not a multiple of any vector width or thread split
  Tensor w = random_tensor({n}, 40), b = Tensor::zeros({n});
  Tensor w64 = f64(w), b64 = Tensor::zeros({n}, DType::kF64);
  for (int64_t step = 1; step <= 5; ++step) {
    Tensor gs = random_tensor({n}, 140 + static_cast<uint64_t>(step));
    const ops::SgdSpec s{1e-2f, 0.9f, 0.1f, step == 1, 0.8};
    ops::sgd_step(w, b, gs, s);
    Tensor g64 = f64(gs);
    ops::sgd_step(w64, b64, g64, s);
  }
  // Five f32 steps of a few roundings each on weights of size ~1: 1e-6 relative.
  EXPECT_TRUE(allclose(w, w64, 1e-6, 1e-6));
  EXPECT_TRUE(allclose(b, b64, 1e-6, 1e-6));

  // The clipping factor gives exactly the step on gradients scaled in place first.
  Tensor gg = random_tensor({n}, 150);
  Tensor w1 = w.clone(), b1 = b.clone(), w2 = w.clone(), b2 = b.clone();
  ops::sgd_step(w1, b1, gg, ops::SgdSpec{1e-2f, 0.9f, 0.1f, false, 0.37});
  Tensor scaled = gg.clone();
  ops::scale_inplace(scaled, 0.37);
  ops::sgd_step(w2, b2, scaled, ops::SgdSpec{1e-2f, 0.9f, 0.1f, false, 1.0});
  EXPECT_TRUE(allclose(w1, w2, 0, 0));
  EXPECT_TRUE(allclose(b1, b2, 0, 0));

  // Momentum 0: no buffer, plain p -= lr (g + wd p); the first step with a buffer is the same.
  Tensor none, w3 = w.clone(), w4 = w.clone(), b4 = Tensor::full({n}, 123.0);
  ops::sgd_step(w3, none, gg, ops::SgdSpec{1e-2f, 0.0f, 0.1f, false, 1.0});
  ops::sgd_step(w4, b4, gg, ops::SgdSpec{1e-2f, 0.9f, 0.1f, true, 1.0});
  EXPECT_TRUE(allclose(w3, w4, 0, 0));
  EXPECT_FALSE(allclose(w3, w, 0, 0));  // the step moved the weights

  // The 16-bit copy written in the pass is the updated weights converted.
  for (DType half : {DType::kBF16, DType::kF16}) {
    Tensor w5 = w.clone(), b5 = b.clone(), w6 = w.clone(), b6 = b.clone();
    Tensor rounded = Tensor::empty({n}, half);
    const ops::SgdSpec s{1e-2f, 0.9f, 0.1f, false, 1.0};
    ops::sgd_step(w5, b5, gg, s, &rounded);
    ops::sgd_step(w6, b6, gg, s);
    EXPECT_TRUE(allclose(w5, w6, 0, 0));
    const Tensor want = w6.to(half);
    EXPECT_EQ(std::memcmp(rounded.raw(), want.raw(), static_cast<size_t>(n) * 2), 0)
        << dtype_name(half);
  }
  Tensor short_buf = Tensor::zeros({n - 1});
  EXPECT_THROW(ops::sgd_step(w, short_buf, gg, ops::SgdSpec{1e-2f, 0.9f, 0.0f, false, 1.0}),
               InvalidArgument);
  EXPECT_THROW(ops::sgd_step(w, b, gg, ops::SgdSpec{1e-2f, -0.5f, 0.0f, false, 1.0}),
               InvalidArgument);
}

// The mixed-precision step writes the 16-bit compute copy in the same pass: its bits must be those
// of converting the updated weights afterwards (what the separate pass did), and the weights and
// moments those of the step without it.
TEST(AdamW, RoundedCopyIsTheConvertedUpdate) {
  const int64_t n = 4099;  // not a multiple of any vector width or thread split
  for (DType half : {DType::kBF16, DType::kF16}) {
    for (DType t : {DType::kF32, DType::kF64}) {
      Tensor p = random_tensor({n}, 27).to(t), g = random_tensor({n}, 28).to(t);
      // Weights over many binades, from f16's subnormals to past its largest finite value.
      for (int64_t i = 0; i < 64; ++i) {
        const double w = std::ldexp(1.0 + static_cast<double>(i) / 64.0, -30 + static_cast<int>(i));
        if (t == DType::kF32)
          p.data<float>()[i] = static_cast<float>(w);
        else
          p.data<double>()[i] = w;
      }
      Tensor m = Tensor::zeros({n}, t), v = Tensor::zeros({n}, t);
      Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
      Tensor rounded = Tensor::empty({n}, half);
      const ops::AdamWSpec spec{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.5};
      ops::adamw_step(p, m, v, g, spec, &rounded);
      ops::adamw_step(p2, m2, v2, g, spec);
      EXPECT_TRUE(allclose(p, p2, 0, 0));
      EXPECT_TRUE(allclose(m, m2, 0, 0));
      EXPECT_TRUE(allclose(v, v2, 0, 0));
      const Tensor want = p2.to(half);
      EXPECT_EQ(std::memcmp(rounded.raw(), want.raw(), static_cast<size_t>(n) * 2), 0)
          << dtype_name(half) << " from " << dtype_name(t);
    }
  }
  Tensor p = Tensor::zeros({8}), m = Tensor::zeros({8}), v = Tensor::zeros({8});
  Tensor wrong = Tensor::empty({7}, DType::kBF16), f32 = Tensor::empty({8});
  EXPECT_THROW(ops::adamw_step(p, m, v, p, {}, &wrong), InvalidArgument);
  EXPECT_THROW(ops::adamw_step(p, m, v, p, {}, &f32), InvalidArgument);
}

TEST(AdamW, Bf16MomentsAreTheF32UpdateRounded) {
  // The precision-aware optimizer's bf16 moments, read and written by the kernel itself: the
  // same bits as the f32 step on the widened moments, with the moments rounded after it (the
  // weights use the unrounded ones, as Transformer Engine's FusedAdam updates them). Three steps,
  // so that the rounded moments are read back; each moment bf16 alone and both.
  const int64_t n = 4099;  // not a multiple of any vector width or thread split
  const Tensor g = random_tensor({n}, 31);
  for (const auto& [m16, v16] : {std::pair{true, true}, {true, false}, {false, true}}) {
    Tensor p = random_tensor({n}, 32), p2 = p.clone();
    Tensor m = Tensor::zeros({n}, m16 ? DType::kBF16 : DType::kF32);
    Tensor v = Tensor::zeros({n}, v16 ? DType::kBF16 : DType::kF32);
    Tensor m2 = Tensor::zeros({n}), v2 = Tensor::zeros({n});
    Tensor rounded = Tensor::empty({n}, DType::kBF16);
    for (int64_t step = 1; step <= 3; ++step) {
      const ops::AdamWSpec spec{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5};
      ops::adamw_step(p, m, v, g, spec, &rounded);
      ops::adamw_step(p2, m2, v2, g, spec);
      if (m16) m2.copy_from(m2.to(DType::kBF16));
      if (v16) v2.copy_from(v2.to(DType::kBF16));
      const std::string at = std::string(m16 ? "bf16" : "f32") + " exp_avg, " +
                             (v16 ? "bf16" : "f32") + " exp_avg_sq, step " + std::to_string(step);
      EXPECT_TRUE(allclose(p, p2, 0, 0)) << at;
      EXPECT_TRUE(allclose(m.to(DType::kF32), m2, 0, 0)) << at;
      EXPECT_TRUE(allclose(v.to(DType::kF32), v2, 0, 0)) << at;
      const Tensor want = p2.to(DType::kBF16);
      EXPECT_EQ(std::memcmp(rounded.raw(), want.raw(), static_cast<size_t>(n) * 2), 0) << at;
    }
  }
  // bf16 moments with f64 weights, f16 moments: refused.
  Tensor p = Tensor::zeros({8}, DType::kF64), g64 = Tensor::zeros({8}, DType::kF64);
  Tensor m = Tensor::zeros({8}, DType::kBF16), v = Tensor::zeros({8}, DType::kF64);
  EXPECT_THROW(ops::adamw_step(p, m, v, g64, {}), InvalidArgument);
  Tensor p32 = Tensor::zeros({8}), g32 = Tensor::zeros({8}), f16m = Tensor::zeros({8}, DType::kF16);
  EXPECT_THROW(ops::adamw_step(p32, f16m, f16m, g32, {}), InvalidArgument);
}

TEST(AdamW, ScaledMomentsAreTheWidenedUpdateStoredWithNewScales) {
  // adamw_step_scaled (two passes: the new moments' absmax, then the step) against the composed
  // form: moments widened (E4M3 codes decoded) times their read scale, adamw_step in f32, each
  // stored with moment_scaling of its abs_max (unscale_moment, store_moment). Three steps, so that
  // stored moments and scales are read back; bits compared.
  const int64_t n = 4099;
  const Tensor g = random_tensor({n}, 41);
  const std::vector<std::pair<DType, DType>> kinds = {{DType::kF16, DType::kF16},
                                                      {DType::kU8, DType::kBF16},
                                                      {DType::kU8, DType::kU8},
                                                      {DType::kF32, DType::kF16}};
  auto scaled = [](DType t) { return t == DType::kF16 || t == DType::kU8; };
  for (const auto& [mt, vt] : kinds) {
    Tensor p = random_tensor({n}, 42), p2 = p.clone();
    Tensor m = Tensor::zeros({n}, mt), v = Tensor::zeros({n}, vt);
    Tensor m2 = m.clone(), v2 = v.clone();
    float ms = 1, vs = 1, ms2 = 1, vs2 = 1;
    Tensor rounded = Tensor::empty({n}, DType::kBF16), rounded2 = rounded.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      const ops::AdamWSpec spec{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5};
      ops::adamw_step_scaled(p, {&m, &ms}, {&v, &vs}, g, spec, &rounded);
      // The composed form.
      Tensor wm = Tensor::empty({n}), wv = Tensor::empty({n});
      ops::unscale_moment(wm, {&m2, &ms2});
      ops::unscale_moment(wv, {&v2, &vs2});
      ops::adamw_step(p2, wm, wv, g, spec, &rounded2);
      ops::store_moment({&m2, &ms2}, wm);
      ops::store_moment({&v2, &vs2}, wv);
      const std::string at =
          std::string(dtype_name(mt)) + "/" + dtype_name(vt) + ", step " + std::to_string(step);
      EXPECT_TRUE(allclose(p, p2, 0, 0)) << at;
      EXPECT_EQ(std::memcmp(m.raw(), m2.raw(), m.nbytes()), 0) << at;
      EXPECT_EQ(std::memcmp(v.raw(), v2.raw(), v.nbytes()), 0) << at;
      EXPECT_EQ(ms, ms2) << at;
      EXPECT_EQ(vs, vs2) << at;
      EXPECT_EQ(std::memcmp(rounded.raw(), rounded2.raw(), rounded.nbytes()), 0) << at;
    }
    if (scaled(mt)) {
      EXPECT_GT(ms, 0.0f) << dtype_name(mt);
    }
  }
  Tensor p = Tensor::zeros({8}), g8 = Tensor::zeros({8}), m = Tensor::zeros({8}, DType::kF16);
  EXPECT_THROW(ops::adamw_step_scaled(p, {&m, nullptr}, {&m, nullptr}, g8, {}), InvalidArgument);
  EXPECT_THROW(ops::moment_scaling(1.0, DType::kBF16), InvalidArgument);
}

TEST(Dropout, MaskIsDeterministicScaledAndReproducedInBackward) {
  Tensor x = Tensor::full({1000}, 1.0);
  Tensor y = Tensor::empty({1000}), y2 = Tensor::empty({1000});
  ops::dropout_forward(y, x, 0.25f, 5, 9);
  ops::dropout_forward(y2, x, 0.25f, 5, 9);
  EXPECT_TRUE(allclose(y, y2, 0, 0));
  int kept = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(y.item(i) == 0.0 || std::fabs(y.item(i) - 1 / 0.75) < 1e-6);
    kept += y.item(i) != 0.0;
  }
  // Binomial(1000, 0.75): mean 750, sd 13.7; 5 sd bounds.
  EXPECT_NEAR(kept, 750, 70);
  Tensor dx = Tensor::empty({1000});
  ops::dropout_backward(dx, x, 0.25f, 5, 9);
  EXPECT_TRUE(allclose(dx, y, 0, 0));
}

TEST(SumSquares, IndependentOfThreadsAndExact) {
  Tensor x = random_tensor({100007}, 27);
  double want = 0;
  for (int64_t i = 0; i < x.numel(); ++i) want += x.item(i) * x.item(i);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = ops::sum_squares(x);
  omp_set_num_threads(3);
  const double three = ops::sum_squares(x);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, three);  // bit-identical: fixed chunks summed in order
  EXPECT_NEAR(one, want, 1e-9 * want);
}

TEST(Bf16, ConversionRoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down to 1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f).bits, 0x3f82);  // halfway, rounds up to even
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  Tensor x = random_tensor({100}, 28);
  EXPECT_TRUE(allclose(x.to(DType::kBF16).to(DType::kF32), x, 0, 1.0 / 256));
  EXPECT_TRUE(allclose(x.to(DType::kF16).to(DType::kF32), x, 1e-7, 1.0 / 2048));
}

}  // namespace
}  // namespace megatron

namespace megatron {
namespace {

TEST(VecMath, ExpAndErfAccuracy) {
  // vexp: the degree-7 series and the split ln 2 keep it within a few ulp (f32 ulp = 1.2e-7
  // relative); verf: the erfc fit is good to 1.2e-7 absolute, plus f32 rounding.
  double worst_exp = 0, worst_erf = 0, worst_tanh = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 200000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(cpu::vexp(x) - want) / want);
    const float y = -6.0f + 12.0f * static_cast<float>(i) / 200000.0f;
    worst_erf = std::max(worst_erf, std::fabs(cpu::verf(y) - std::erf(static_cast<double>(y))));
    worst_tanh = std::max(worst_tanh, std::fabs(cpu::vtanh(y) - std::tanh(static_cast<double>(y))));
  }
  EXPECT_LT(worst_tanh, 3e-7);
  EXPECT_LT(worst_exp, 5e-7);
  EXPECT_LT(worst_erf, 3e-7);
  EXPECT_EQ(cpu::vexp(-1000.0f), cpu::vexp(-87.0f));  // flushes to the smallest value, not NaN
  EXPECT_TRUE(std::isnan(cpu::vexp(std::nanf(""))));
}

}  // namespace
}  // namespace megatron
