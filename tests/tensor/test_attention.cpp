// The attention op (ops::attention_forward/backward/merge) against its fp64 reference
// (ref::attention), and the reference's backward against central finite differences.
//
// Covered: q, k, v read from Megatron's packed QKV through views and as separate tensors;
// causal and not; sq != skv (cross-attention); global offsets (a decode step after a KV cache);
// document starts; sliding windows; key padding; an additive bias shared over the batch or per
// sequence, with its gradient; attention dropout; rows that see no key; results over two key
// blocks merged through their log-sum-exps against one pass, backward included; and attention
// sinks against their definition (one more key of score sink_h and value 0).
//
// Tolerances (the reason for each number): fast f32 against the f64 reference: inputs are O(1),
// rows at most a few hundred keys, so f32 rounding (6e-8 relative per operation, growing with the
// reduction length) stays below 1e-5 relative: atol 2e-5, rtol 1e-4 (gradients, which sum over
// sq or skv more terms, atol 1e-4). Fast f64 against finite differences, and the reference's
// backward against them: central differences with step 1e-6 on smooth functions are accurate to
// about 1e-8: 1e-6. Merged halves against one pass in f64 differ only by rounding (1e-16
// relative per operation): 1e-10.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cpu/tile_gemm_bf16.h"
#include "tensor/ops.h"
#include "tensor/reference/reference.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using testing::allclose;
using testing::fd_grad;
using testing::random_tensor;

constexpr double kF32Atol = 2e-5, kF32Rtol = 1e-4, kF32GradAtol = 1e-4;
constexpr double kFdTol = 1e-6;
constexpr double kF64Tol = 1e-10;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

Tensor f64(const Tensor& t) {
  return t.to(DType::kF64);
}

// The spec with its bias in f64, for the reference.
ops::AttentionSpec as_f64(ops::AttentionSpec spec) {
  if (spec.bias.defined()) spec.bias = f64(spec.bias);
  return spec;
}

// lse rows of -inf must agree exactly; the others within the tolerance.
::testing::AssertionResult lse_close(const Tensor& got, const Tensor& want, double atol,
                                     double rtol) {
  Tensor g = f64(got), w = f64(want);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const bool gi = g.data<double>()[i] == kNegInf, wi = w.data<double>()[i] == kNegInf;
    if (gi != wi) {
      return ::testing::AssertionFailure()
             << "lse[" << i << "] = " << g.data<double>()[i] << ", want " << w.data<double>()[i];
    }
    if (gi) g.data<double>()[i] = w.data<double>()[i] = 0;
  }
  return allclose(g, w, atol, rtol);
}

// One call's inputs: q [sq, b, np, hn], k and v [skv, b, ng, hn] (any float dtype, contiguous).
struct Inputs {
  Tensor q, k, v;
  int64_t groups;
  ops::AttentionSpec spec;
};

struct Outputs {
  Tensor out, lse, dq, dk, dv, dbias;
};

Outputs run_fast(const Inputs& in, const Tensor& dout) {
  const int64_t sq = in.q.dim(0), b = in.q.dim(1), np = in.q.dim(2), hn = in.q.dim(3);
  const DType dt = in.q.dtype();
  Outputs o{Tensor::empty({sq, b, np, hn}, dt),
            Tensor::empty({b, np, sq}, dt),
            Tensor::empty(in.q.shape(), dt),
            Tensor::empty(in.k.shape(), dt),
            Tensor::empty(in.v.shape(), dt),
            in.spec.bias.defined() ? Tensor::empty(in.spec.bias.shape(), dt) : Tensor()};
  const auto q = ops::attention_view(in.q, in.groups), k = ops::attention_view(in.k, in.groups),
             v = ops::attention_view(in.v, in.groups);
  ops::attention_forward(o.out, o.lse, q, k, v, in.spec);
  ops::attention_backward(
      ops::attention_view(o.dq, in.groups), ops::attention_view(o.dk, in.groups),
      ops::attention_view(o.dv, in.groups), o.dbias, dout, q, k, v, o.out, o.lse, in.spec);
  return o;
}

// The f32 kernels against the reference, forward and backward; with `fd`, the reference's and
// the fast f64 kernel's gradients against finite differences of the reference forward (small
// cases only: one forward per input element).
void expect_matches_reference(const Inputs& in, uint64_t seed, bool fd) {
  const ops::AttentionSpec spec64 = as_f64(in.spec);
  const Tensor q64 = f64(in.q), k64 = f64(in.k), v64 = f64(in.v);
  const ref::AttentionResult want = ref::attention(q64, k64, v64, spec64);
  const Tensor dout = random_tensor(want.out.shape(), seed);
  const Outputs got = run_fast(in, dout);
  EXPECT_TRUE(allclose(got.out, want.out, kF32Atol, kF32Rtol)) << "out";
  EXPECT_TRUE(lse_close(got.lse, want.lse, kF32Atol, kF32Rtol)) << "lse";
  const ref::AttentionGrads wg = ref::attention_backward(f64(dout), q64, k64, v64, spec64);
  EXPECT_TRUE(allclose(got.dq, wg.dq, kF32GradAtol, kF32Rtol)) << "dq";
  EXPECT_TRUE(allclose(got.dk, wg.dk, kF32GradAtol, kF32Rtol)) << "dk";
  EXPECT_TRUE(allclose(got.dv, wg.dv, kF32GradAtol, kF32Rtol)) << "dv";
  if (in.spec.bias.defined()) {
    EXPECT_TRUE(allclose(got.dbias, wg.dbias, kF32GradAtol, kF32Rtol)) << "dbias";
  }
  if (!fd) return;
  const Tensor d64 = f64(dout);
  const Tensor fq =
      fd_grad([&](const Tensor& x) { return ref::attention(x, k64, v64, spec64).out; }, q64, d64);
  const Tensor fk =
      fd_grad([&](const Tensor& x) { return ref::attention(q64, x, v64, spec64).out; }, k64, d64);
  const Tensor fv =
      fd_grad([&](const Tensor& x) { return ref::attention(q64, k64, x, spec64).out; }, v64, d64);
  EXPECT_TRUE(allclose(wg.dq, fq, kFdTol, kFdTol)) << "reference dq vs finite differences";
  EXPECT_TRUE(allclose(wg.dk, fk, kFdTol, kFdTol)) << "reference dk vs finite differences";
  EXPECT_TRUE(allclose(wg.dv, fv, kFdTol, kFdTol)) << "reference dv vs finite differences";
  Inputs in64{q64, k64, v64, in.groups, spec64};
  const Outputs g64 = run_fast(in64, d64);
  EXPECT_TRUE(allclose(g64.dq, fq, kFdTol, kFdTol)) << "fast f64 dq vs finite differences";
  EXPECT_TRUE(allclose(g64.dk, fk, kFdTol, kFdTol)) << "fast f64 dk vs finite differences";
  EXPECT_TRUE(allclose(g64.dv, fv, kFdTol, kFdTol)) << "fast f64 dv vs finite differences";
  if (in.spec.bias.defined()) {
    const Tensor fb = fd_grad(
        [&](const Tensor& x) {
          ops::AttentionSpec s = spec64;
          s.bias = x;
          return ref::attention(q64, k64, v64, s).out;
        },
        spec64.bias, d64);
    EXPECT_TRUE(allclose(wg.dbias, fb, kFdTol, kFdTol)) << "reference dbias vs fd";
    EXPECT_TRUE(allclose(g64.dbias, fb, kFdTol, kFdTol)) << "fast f64 dbias vs fd";
  }
}

Inputs random_inputs(int64_t sq, int64_t skv, int64_t b, int64_t ng, int64_t qpg, int64_t hn,
                     uint64_t seed) {
  Inputs in{random_tensor({sq, b, ng * qpg, hn}, seed, 1.5),
            random_tensor({skv, b, ng, hn}, seed + 1, 1.5),
            random_tensor({skv, b, ng, hn}, seed + 2, 1.5),
            ng,
            {}};
  in.spec.scale = 1.0f / std::sqrt(static_cast<float>(hn));
  return in;
}

// ---- q, k, v read from Megatron's packed QKV ---------------------------------------------------

// The contiguous q [s, b, ng qpg, hn], k and v [s, b, ng, hn] of a packed qkv.
Inputs split_packed(const Tensor& qkv, const ops::AttentionSpec& spec) {
  const int64_t s = qkv.dim(0), b = qkv.dim(1), ng = qkv.dim(2), qpg = qkv.dim(3) - 2,
                hn = qkv.dim(4);
  Inputs in{Tensor::empty({s, b, ng * qpg, hn}, qkv.dtype()),
            Tensor::empty({s, b, ng, hn}, qkv.dtype()), Tensor::empty({s, b, ng, hn}, qkv.dtype()),
            ng, spec};
  Tensor src = f64(qkv), q = f64(in.q), k = f64(in.k), v = f64(in.v);
  for (int64_t t = 0; t < s * b; ++t)
    for (int64_t g = 0; g < ng; ++g)
      for (int64_t p = 0; p < qpg + 2; ++p)
        for (int64_t c = 0; c < hn; ++c) {
          const double x = src.data<double>()[((t * ng + g) * (qpg + 2) + p) * hn + c];
          if (p < qpg) q.data<double>()[((t * ng + g) * qpg + p) * hn + c] = x;
          if (p == qpg) k.data<double>()[(t * ng + g) * hn + c] = x;
          if (p == qpg + 1) v.data<double>()[(t * ng + g) * hn + c] = x;
        }
  in.q = q.to(qkv.dtype());
  in.k = k.to(qkv.dtype());
  in.v = v.to(qkv.dtype());
  return in;
}

struct PackedCase {
  int64_t s, b, ng, qpg, hn;
  bool causal;
  float dropout;
};

class PackedAttentionTest : public ::testing::TestWithParam<PackedCase> {};

// The packed views read (and their gradients write) exactly what separate tensors hold: the
// packed run equals the separate run bit for bit, and both match the reference.
TEST_P(PackedAttentionTest, ViewsIntoPackedQkvMatchSeparateTensorsAndReference) {
  const PackedCase c = GetParam();
  ops::AttentionSpec spec;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(c.hn));
  spec.causal = c.causal;
  spec.dropout = c.dropout;
  spec.seed = 42;
  spec.stream = 7;
  const Tensor qkv = random_tensor({c.s, c.b, c.ng, c.qpg + 2, c.hn}, 21, 1.5);
  const Inputs sep = split_packed(qkv, spec);
  const int64_t np = c.ng * c.qpg;
  Tensor out = Tensor::empty({c.s, c.b, np, c.hn}), lse = Tensor::empty({c.b, np, c.s});
  using ops::packed_qkv_view, ops::QkvPart;
  ops::attention_forward(out, lse, packed_qkv_view(qkv, QkvPart::kQuery),
                         packed_qkv_view(qkv, QkvPart::kKey), packed_qkv_view(qkv, QkvPart::kValue),
                         spec);
  const Tensor dout = random_tensor(out.shape(), 22);
  Tensor dqkv = Tensor::empty(qkv.shape());
  ops::attention_backward(
      packed_qkv_view(dqkv, QkvPart::kQuery), packed_qkv_view(dqkv, QkvPart::kKey),
      packed_qkv_view(dqkv, QkvPart::kValue), Tensor(), dout, packed_qkv_view(qkv, QkvPart::kQuery),
      packed_qkv_view(qkv, QkvPart::kKey), packed_qkv_view(qkv, QkvPart::kValue), out, lse, spec);
  const Outputs s = run_fast(sep, dout);
  // Exact: the same kernel on the same values in the same order, only addressed otherwise.
  EXPECT_TRUE(allclose(out, s.out, 0, 0));
  EXPECT_TRUE(allclose(lse, s.lse, 0, 0));
  const Inputs dsplit = split_packed(dqkv, spec);
  EXPECT_TRUE(allclose(dsplit.q, s.dq, 0, 0));
  EXPECT_TRUE(allclose(dsplit.k, s.dk, 0, 0));
  EXPECT_TRUE(allclose(dsplit.v, s.dv, 0, 0));
  expect_matches_reference(sep, 22, c.s * c.b * c.ng * (c.qpg + 2) * c.hn <= 2000);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PackedAttentionTest,
    ::testing::Values(PackedCase{5, 2, 2, 1, 4, true, 0.0f},     // MHA, tiny, FD-checked
                      PackedCase{7, 1, 1, 3, 3, true, 0.0f},     // GQA 3 queries per group
                      PackedCase{6, 1, 2, 2, 4, false, 0.0f},    // non-causal
                      PackedCase{5, 2, 1, 2, 4, true, 0.3f},     // dropout, FD-checked
                      PackedCase{131, 2, 2, 2, 16, true, 0.0f},  // > 2 tiles, odd length
                      PackedCase{70, 1, 1, 1, 8, true, 0.1f},    // dropout across tiles
                      // Tile GEMMs at their full register width (hn 64), partial last tiles,
                      // several query tiles per key tile, GQA and non-causal across tiles, a
                      // head size that is no multiple of the vector width.
                      PackedCase{150, 2, 2, 1, 64, true, 0.0f},
                      PackedCase{130, 1, 2, 3, 32, true, 0.0f},
                      PackedCase{129, 1, 1, 2, 20, false, 0.0f},
                      PackedCase{97, 1, 2, 2, 24, true, 0.2f}));

// ---- masks -------------------------------------------------------------------------------------

Tensor doc_starts(int64_t b, int64_t s, const std::vector<std::vector<int64_t>>& docs) {
  Tensor t = Tensor::empty({b, s}, DType::kI32);
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t i = 0; i < s; ++i) {
      int64_t start = 0;
      for (int64_t d : docs[static_cast<size_t>(bb)])
        if (d <= i) start = d;
      t.data<int32_t>()[bb * s + i] = static_cast<int32_t>(start);
    }
  return t;
}

TEST(Attention, DocumentStartsMatchReferenceAndFiniteDifferences) {
  // Documents [0, 3), [3, 7) and [0, 5), [5, 6), [6, 7) (--reset-attention-mask).
  Inputs in = random_inputs(7, 7, 2, 1, 2, 3, 31);
  in.spec.doc_start = doc_starts(2, 7, {{0, 3}, {0, 5, 6}});
  expect_matches_reference(in, 32, true);
  // The first token of a document sees only itself: its output is its own value vector.
  const Outputs o = run_fast(in, random_tensor({7, 2, 2, 3}, 33));
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(o.out.item(((3 * 2 + 0) * 2 + 0) * 3 + c), in.v.item((3 * 2 + 0) * 3 + c), 1e-6);
  }
}

TEST(Attention, DocumentStartsAcrossTiles) {
  // Documents that start inside, at and just after 64-position tile boundaries: whole key tiles
  // are skipped for some query tiles, partly masked for others.
  Inputs in = random_inputs(150, 150, 2, 2, 2, 32, 34);
  in.spec.doc_start = doc_starts(2, 150, {{0, 40, 64, 65, 149}, {0, 127, 128}});
  expect_matches_reference(in, 35, false);
}

TEST(Attention, SlidingWindowMatchesReferenceAndFiniteDifferences) {
  // --window-size 3,0: query i sees keys i-3 .. i.
  Inputs in = random_inputs(9, 9, 2, 2, 2, 4, 60);
  in.spec.window = 3;
  expect_matches_reference(in, 61, true);
  // Against the same call with the window written as document starts (the first visible key of
  // each query), which the kernels mask independently.
  Inputs docs = in;
  docs.spec.window = -1;
  docs.spec.doc_start = doc_starts(2, 9, {{0}, {0}});
  for (int64_t bb = 0; bb < 2; ++bb)
    for (int64_t i = 0; i < 9; ++i)
      docs.spec.doc_start.data<int32_t>()[bb * 9 + i] =
          static_cast<int32_t>(std::max<int64_t>(0, i - 3));
  const Tensor dout = random_tensor({9, 2, 4, 4}, 62);
  const Outputs a = run_fast(in, dout), b = run_fast(docs, dout);
  EXPECT_TRUE(allclose(a.out, b.out, 0, 0)) << "out";
  EXPECT_TRUE(allclose(a.dq, b.dq, 0, 0) && allclose(a.dk, b.dk, 0, 0) &&
              allclose(a.dv, b.dv, 0, 0));
  // Window 0: each query sees only itself, its output its own value vector.
  in.spec.window = 0;
  const Outputs o = run_fast(in, dout);
  for (int64_t c = 0; c < 4; ++c)
    EXPECT_NEAR(o.out.item(((5 * 2 + 1) * 4 + 2) * 4 + c), in.v.item(((5 * 2 + 1) * 2 + 1) * 4 + c),
                1e-6);
}

TEST(Attention, SlidingWindowAcrossTilesOffsetsAndDocuments) {
  // Windows shorter and longer than the 64-wide tiles (whole key tiles skipped for some query
  // tiles), with documents, and a chunk of queries after a cache (q_offset).
  for (int64_t window : {5, 70, 200}) {
    Inputs in = random_inputs(150, 150, 2, 2, 2, 32, 63);
    in.spec.window = window;
    in.spec.doc_start = doc_starts(2, 150, {{0, 40, 100}, {0, 127}});
    expect_matches_reference(in, 64, false);
  }
  Inputs tail = random_inputs(20, 90, 1, 2, 2, 16, 65);
  tail.spec.q_offset = 70;  // queries 70 .. 89 over keys 0 .. 89
  tail.spec.window = 30;
  expect_matches_reference(tail, 66, false);
}

// Sinks as one more key at position -1, of zero key and value vectors, whose score is the sink
// through an additive bias: the definition restated with the plain op. The sink is seen by every
// query, so the window (queries at positions >= 0, keys from kv_offset 0) is written into the
// bias as -inf instead. Returns the reference out, lse, gradients and the sink's gradient (the
// bias gradient's column).
struct SinkRef {
  Tensor out, lse, dq, dk, dv, dsink;
};
SinkRef sinks_by_extra_key(const Inputs& in, const Tensor& sink, const Tensor& dout) {
  const int64_t sq = in.q.dim(0), skv = in.k.dim(0), b = in.q.dim(1), np = in.q.dim(2),
                ng = in.k.dim(2), hn = in.q.dim(3);
  Tensor k = Tensor::zeros({skv + 1, b, ng, hn}, DType::kF64);
  Tensor v = Tensor::zeros({skv + 1, b, ng, hn}, DType::kF64);
  const Tensor k64 = f64(in.k), v64 = f64(in.v);
  std::copy(k64.data<double>(), k64.data<double>() + k64.numel(), k.data<double>() + b * ng * hn);
  std::copy(v64.data<double>(), v64.data<double>() + v64.numel(), v.data<double>() + b * ng * hn);
  ops::AttentionSpec spec = as_f64(in.spec);
  spec.kv_offset = in.spec.kv_offset - 1;
  spec.window = -1;
  Tensor bias = Tensor::zeros({1, np, sq, skv + 1}, DType::kF64);
  for (int64_t h = 0; h < np; ++h)
    for (int64_t i = 0; i < sq; ++i) {
      double* row = bias.data<double>() + (h * sq + i) * (skv + 1);
      row[0] = sink.item(h);
      for (int64_t j = 0; j < skv; ++j)
        if (in.spec.window >= 0 && j < in.spec.q_offset + i - in.spec.window) row[j + 1] = kNegInf;
    }
  spec.bias = bias;
  const ref::AttentionResult r = ref::attention(f64(in.q), k, v, spec);
  const ref::AttentionGrads g = ref::attention_backward(f64(dout), f64(in.q), k, v, spec);
  SinkRef s{r.out,
            r.lse,
            g.dq,
            g.dk.slice0(1, skv + 1),
            g.dv.slice0(1, skv + 1),
            Tensor::zeros({np}, DType::kF64)};
  for (int64_t h = 0; h < np; ++h)
    for (int64_t i = 0; i < sq; ++i)
      s.dsink.data<double>()[h] += g.dbias.data<double>()[(h * sq + i) * (skv + 1)];
  return s;
}

TEST(Attention, SinksMatchAnExtraKeyAndFiniteDifferences) {
  for (const DType dt : {DType::kF32, DType::kF64}) {
    Inputs in = random_inputs(11, 11, 2, 2, 2, 8, 70);
    in.q = in.q.to(dt);
    in.k = in.k.to(dt);
    in.v = in.v.to(dt);
    in.spec.window = 4;  // gpt-oss's sliding layers carry sinks too
    const Tensor sink = random_tensor({4}, 71, 2.0, DType::kF64);
    const Tensor dout = random_tensor({11, 2, 4, 8}, 72).to(dt);
    const SinkRef want = sinks_by_extra_key(in, sink, dout);
    // The op: the attention, the sink merged in, backward on the merged out and lse.
    Outputs o{Tensor::empty({11, 2, 4, 8}, dt), Tensor::empty({2, 4, 11}, dt),
              Tensor::empty(in.q.shape(), dt),  Tensor::empty(in.k.shape(), dt),
              Tensor::empty(in.v.shape(), dt),  Tensor()};
    const auto q = ops::attention_view(in.q, 2), k = ops::attention_view(in.k, 2),
               v = ops::attention_view(in.v, 2);
    ops::attention_forward(o.out, o.lse, q, k, v, in.spec);
    const Tensor s = sink.to(dt);
    ops::attention_sink_forward(o.out, o.lse, s);
    ops::attention_backward(ops::attention_view(o.dq, 2), ops::attention_view(o.dk, 2),
                            ops::attention_view(o.dv, 2), Tensor(), dout, q, k, v, o.out, o.lse,
                            in.spec);
    Tensor dsink = Tensor::empty({4}, dt);
    ops::attention_sink_backward(dsink, dout, o.out, o.lse, s);
    const double atol = dt == DType::kF64 ? kF64Tol : kF32GradAtol;
    const double rtol = dt == DType::kF64 ? kF64Tol : kF32Rtol;
    EXPECT_TRUE(allclose(o.out, want.out, atol, rtol)) << "out";
    EXPECT_TRUE(allclose(o.lse, want.lse, atol, rtol)) << "lse";
    EXPECT_TRUE(allclose(o.dq, want.dq, atol, rtol)) << "dq";
    EXPECT_TRUE(allclose(o.dk, want.dk, atol, rtol)) << "dk";
    EXPECT_TRUE(allclose(o.dv, want.dv, atol, rtol)) << "dv";
    EXPECT_TRUE(allclose(dsink, want.dsink, atol, rtol)) << "dsink";
    if (dt != DType::kF64) continue;
    // The sink's gradient against central differences of the definition.
    const Tensor fs = fd_grad([&](const Tensor& x) { return sinks_by_extra_key(in, x, dout).out; },
                              sink, f64(dout));
    EXPECT_TRUE(allclose(dsink, fs, kFdTol, kFdTol)) << "dsink vs finite differences";
    // Off-by-one: a sink of 0 adds exp(0) = 1 to every denominator.
    Tensor zero_out = Tensor::empty({11, 2, 4, 8}, dt), zero_lse = Tensor::empty({2, 4, 11}, dt);
    ops::attention_forward(zero_out, zero_lse, q, k, v, in.spec);
    Tensor plain_lse = zero_lse.to(DType::kF64);
    ops::attention_sink_forward(zero_out, zero_lse, Tensor::zeros({4}, dt));
    for (int64_t i = 0; i < plain_lse.numel(); ++i)
      EXPECT_NEAR(zero_lse.item(i), std::log(std::exp(plain_lse.item(i)) + 1), 1e-12);
  }
}

TEST(Attention, KeyPaddingNonCausal) {
  // BERT-style: every query sees the real keys of its sequence, padding (0) is never seen.
  Inputs in = random_inputs(6, 6, 2, 2, 1, 4, 40);
  in.spec.causal = false;
  in.spec.key_valid = Tensor::empty({2, 6}, DType::kI32);
  const int32_t valid[] = {1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1};
  std::copy(valid, valid + 12, in.spec.key_valid.data<int32_t>());
  expect_matches_reference(in, 41, true);
  // Padding in the middle and at the end of sequences longer than two tiles, with causal.
  Inputs big = random_inputs(140, 140, 2, 1, 2, 16, 42);
  big.spec.key_valid = Tensor::empty({2, 140}, DType::kI32);
  for (int64_t j = 0; j < 140; ++j) {
    big.spec.key_valid.data<int32_t>()[j] = j < 100;
    big.spec.key_valid.data<int32_t>()[140 + j] = j % 64 != 3 && (j < 60 || j > 70);
  }
  expect_matches_reference(big, 43, false);
}

TEST(Attention, RowsThatSeeNoKeyGiveZeroAndMinusInfinity) {
  // Sequence 1 is all padding; sequence 0 sees keys 2.. only, so causal rows 0 and 1 see none.
  Inputs in = random_inputs(5, 5, 2, 1, 2, 4, 44);
  in.spec.key_valid = Tensor::empty({2, 5}, DType::kI32);
  const int32_t valid[] = {0, 0, 1, 1, 1, 0, 0, 0, 0, 0};
  std::copy(valid, valid + 10, in.spec.key_valid.data<int32_t>());
  expect_matches_reference(in, 45, true);
  const Outputs o = run_fast(in, random_tensor({5, 2, 2, 4}, 46));
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(o.lse.item((0 * 2 + h) * 5 + 0), kNegInf);
    EXPECT_EQ(o.lse.item((1 * 2 + h) * 5 + 4), kNegInf);
  }
  for (int64_t i = 0; i < o.dq.numel(); ++i) EXPECT_TRUE(std::isfinite(o.dq.item(i))) << i;
  for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(o.out.item(((4 * 2 + 1) * 2 + 1) * 4 + c), 0.0);
}

// ---- cross-attention, offsets, bias ------------------------------------------------------------

TEST(Attention, CrossAttentionWithOwnLengths) {
  Inputs in = random_inputs(5, 9, 2, 2, 2, 4, 50);
  in.spec.causal = false;
  expect_matches_reference(in, 51, true);
  // Across tiles: 70 queries against 150 keys, and 150 against 70; GQA.
  Inputs a = random_inputs(70, 150, 1, 2, 2, 32, 52);
  a.spec.causal = false;
  expect_matches_reference(a, 53, false);
  Inputs b = random_inputs(150, 70, 2, 1, 3, 16, 54);
  b.spec.causal = false;
  b.spec.dropout = 0.1f;
  b.spec.seed = 3;
  expect_matches_reference(b, 55, false);
}

TEST(Attention, DecodeStepsAfterAKvCacheEqualTheLastRowsOfOnePass) {
  // Queries at global positions 7..9 (q_offset 7) against the 10 keys of a cache: causal in
  // global positions. Independently of the reference, their outputs are the last three rows of
  // causal attention over all 10 positions.
  const int64_t s = 10, b = 2, ng = 2, qpg = 2, hn = 8, sq = 3;
  Inputs full = random_inputs(s, s, b, ng, qpg, hn, 60);
  Inputs step = full;
  step.q = full.q.slice0(s - sq, s).clone();
  step.spec.q_offset = s - sq;
  expect_matches_reference(step, 61, false);
  const Outputs whole = run_fast(full, random_tensor({s, b, ng * qpg, hn}, 62));
  const Outputs part = run_fast(step, random_tensor({sq, b, ng * qpg, hn}, 63));
  EXPECT_TRUE(allclose(part.out, whole.out.slice0(s - sq, s), kF32Atol, kF32Rtol));
  // One query (sq 1), FD-checked, with a kv_offset too: keys at global positions 4..9.
  Inputs one = random_inputs(1, 6, 1, 1, 2, 4, 64);
  one.spec.q_offset = 8;
  one.spec.kv_offset = 4;
  expect_matches_reference(one, 65, true);
}

TEST(Attention, AdditiveBiasSharedAndPerSequenceWithGradient) {
  for (int64_t bias_batch : {1, 2}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "bias batch " << bias_batch << " causal " << causal);
      Inputs in = random_inputs(5, 6, 2, 1, 2, 4, 70);
      in.spec.causal = causal;
      in.spec.q_offset = causal ? 1 : 0;  // every causal row sees at least one key
      in.spec.bias = random_tensor({bias_batch, 2, 5, 6}, 71, 2.0);
      expect_matches_reference(in, 72, true);
    }
  }
  // Across tiles (T5's relative-position bias is shared over the batch).
  Inputs big = random_inputs(80, 80, 3, 2, 1, 16, 73);
  big.spec.causal = false;
  big.spec.bias = random_tensor({1, 2, 80, 80}, 74, 2.0);
  expect_matches_reference(big, 75, false);
}

// ---- merging results over key blocks -----------------------------------------------------------

// Keys [0, split) and [split, s) run as two calls (kv_offset, one dropout grid over all s keys)
// and merged through their log-sum-exps give one pass over all keys; their backward passes, run
// with the merged out and lse, give the one pass's dq (summed) and dk, dv (concatenated).
void expect_halves_merge(DType dtype, double atol, double rtol) {
  const int64_t s = 150, b = 2, ng = 2, qpg = 2, hn = 16, split = 70;
  Inputs full = random_inputs(s, s, b, ng, qpg, hn, 80);
  full.q = full.q.to(dtype);
  full.k = full.k.to(dtype);
  full.v = full.v.to(dtype);
  full.spec.dropout = 0.1f;
  full.spec.seed = 5;
  full.spec.kv_positions = s;
  Inputs a = full, bh = full;
  a.k = full.k.slice0(0, split).clone();
  a.v = full.v.slice0(0, split).clone();
  bh.k = full.k.slice0(split, s).clone();
  bh.v = full.v.slice0(split, s).clone();
  bh.spec.kv_offset = split;
  const Tensor dout = random_tensor({s, b, ng * qpg, hn}, 81, 1.0, dtype);
  const Outputs one = run_fast(full, dout);

  auto forward = [&](const Inputs& in, Tensor& out, Tensor& lse) {
    out = Tensor::empty({s, b, ng * qpg, hn}, dtype);
    lse = Tensor::empty({b, ng * qpg, s}, dtype);
    ops::attention_forward(out, lse, ops::attention_view(in.q, ng), ops::attention_view(in.k, ng),
                           ops::attention_view(in.v, ng), in.spec);
  };
  Tensor out, lse, out_b, lse_b;
  forward(a, out, lse);
  forward(bh, out_b, lse_b);
  // Causal: queries 0..69 see no key of the second block (lse -inf there).
  EXPECT_EQ(lse_b.item(0), kNegInf);
  ops::attention_merge(out, lse, out_b, lse_b);
  EXPECT_TRUE(allclose(out, one.out, atol, rtol)) << "merged out";
  EXPECT_TRUE(lse_close(lse, one.lse, atol, rtol)) << "merged lse";

  auto backward = [&](const Inputs& in, Tensor& dq, Tensor& dk, Tensor& dv) {
    dq = Tensor::empty(in.q.shape(), dtype);
    dk = Tensor::empty(in.k.shape(), dtype);
    dv = Tensor::empty(in.v.shape(), dtype);
    ops::attention_backward(ops::attention_view(dq, ng), ops::attention_view(dk, ng),
                            ops::attention_view(dv, ng), Tensor(), dout,
                            ops::attention_view(in.q, ng), ops::attention_view(in.k, ng),
                            ops::attention_view(in.v, ng), out, lse, in.spec);
  };
  Tensor dq_a, dk_a, dv_a, dq_b, dk_b, dv_b;
  backward(a, dq_a, dk_a, dv_a);
  backward(bh, dq_b, dk_b, dv_b);
  ops::add_inplace(dq_a, dq_b);
  EXPECT_TRUE(allclose(dq_a, one.dq, atol, rtol)) << "dq summed over blocks";
  EXPECT_TRUE(allclose(dk_a, one.dk.slice0(0, split), atol, rtol)) << "dk, first block";
  EXPECT_TRUE(allclose(dk_b, one.dk.slice0(split, s), atol, rtol)) << "dk, second block";
  EXPECT_TRUE(allclose(dv_a, one.dv.slice0(0, split), atol, rtol)) << "dv, first block";
  EXPECT_TRUE(allclose(dv_b, one.dv.slice0(split, s), atol, rtol)) << "dv, second block";
}

TEST(Attention, TwoKeyHalvesMergedThroughLseEqualOnePass) {
  // f32: the merge rescales by exp(lse_a - lse') in f32 and sums two partial outputs each
  // rounded once more than in one pass: differences of a few 1e-7 relative; 1e-5.
  expect_halves_merge(DType::kF32, 1e-5, 1e-5);
  expect_halves_merge(DType::kF64, kF64Tol, kF64Tol);
}

// bf16 runs (AttentionSpec::precision bf16) multiply bf16 tiles on CPUs with AVX-512 BF16:
// against the f32 kernels on the same inputs rounded to bf16, only the probabilities' and dS's
// rounding to bf16 (2^-9 relative) separates them: NMSE 1e-6 to 5e-6, bound 1e-4 (the CUDA
// device's tensor-core test uses the same bound); lse sums the same exact bf16 products in f32:
// 1e-8. The cases cover odd query tiles (99 rows: a last pair half empty), GQA, hn 80 (a
// 16-column tail), hn 128 with documents and dropout, padded keys without the causal mask, a
// decode step after a cache, an additive bias, and hn 72, which keeps the f32 tiles (bit-equal).
TEST(Attention, Bf16TilesMatchF32OnRoundedInputs) {
  struct Case {
    int64_t sq, skv, b, np, ng, hn;
    bool causal;
    int64_t q_offset;
    bool docs, padding, bias;
    float dropout;
  };
  const Case cases[] = {{99, 99, 2, 4, 2, 64, true, 0, false, false, false, 0.0f},
                        {70, 70, 1, 2, 1, 80, true, 0, false, false, false, 0.0f},
                        {130, 130, 1, 2, 2, 128, true, 0, true, false, false, 0.1f},
                        {70, 150, 2, 2, 1, 64, false, 0, false, true, false, 0.0f},
                        {37, 101, 1, 4, 4, 64, true, 64, false, false, false, 0.0f},
                        {64, 64, 2, 2, 2, 64, true, 0, false, false, true, 0.0f},
                        {50, 50, 1, 2, 2, 72, true, 0, false, false, false, 0.0f}};
  uint64_t seed = 300;
  for (const Case& c : cases) {
    SCOPED_TRACE("sq " + std::to_string(c.sq) + " hn " + std::to_string(c.hn));
    Inputs in{random_tensor({c.sq, c.b, c.np, c.hn}, ++seed),
              random_tensor({c.skv, c.b, c.ng, c.hn}, ++seed),
              random_tensor({c.skv, c.b, c.ng, c.hn}, ++seed),
              c.ng,
              {}};
    in.spec.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.hn)));
    in.spec.causal = c.causal;
    in.spec.q_offset = c.q_offset;
    in.spec.dropout = c.dropout;
    in.spec.seed = 7;
    in.spec.stream = 3;
    if (c.docs) in.spec.doc_start = doc_starts(c.b, c.sq, {{0, 50}});
    if (c.padding) {  // the last 20 keys of sequence 1 are padding
      in.spec.key_valid = Tensor::empty({c.b, c.skv}, DType::kI32);
      for (int64_t i = 0; i < c.b * c.skv; ++i)
        in.spec.key_valid.data<int32_t>()[i] = i / c.skv == 1 && i % c.skv >= c.skv - 20 ? 0 : 1;
    }
    if (c.bias) in.spec.bias = random_tensor({1, c.np, c.sq, c.skv}, ++seed);
    const Tensor dout = random_tensor({c.sq, c.b, c.np, c.hn}, ++seed);
    auto rounded = [](const Tensor& x) { return x.to(DType::kBF16).to(DType::kF32); };
    Inputs tiles = in;
    tiles.spec.precision = DType::kBF16;
    const Outputs got = run_fast(tiles, dout);
    Inputs f32 = {rounded(in.q), rounded(in.k), rounded(in.v), in.groups, in.spec};
    const Outputs want = run_fast(f32, dout.to(DType::kBF16).to(DType::kF32));
    if (!cpu::kBf16Tiles || c.hn % 16 != 0) {  // f32 tiles: the plain f32 kernels' bits
      const Outputs plain = run_fast(in, dout);
      for (auto [a, b] : {std::pair{got.out, plain.out},
                          {got.dq, plain.dq},
                          {got.dk, plain.dk},
                          {got.dv, plain.dv}})
        EXPECT_TRUE(allclose(a, b, 0, 0));
      continue;
    }
    EXPECT_LT(testing::nmse(got.out, want.out), 1e-4);
    EXPECT_TRUE(lse_close(got.lse, want.lse, 1e-5, 1e-5));
    EXPECT_LT(testing::nmse(got.dq, want.dq), 1e-4);
    EXPECT_LT(testing::nmse(got.dk, want.dk), 1e-4);
    EXPECT_LT(testing::nmse(got.dv, want.dv), 1e-4);
    if (c.bias) {
      EXPECT_LT(testing::nmse(got.dbias, want.dbias), 1e-4);
    }
    // The probabilities' rounding shows: the bf16 tiles ran.
    EXPECT_GT(testing::nmse(got.out, want.out), 1e-12);
  }
}

// Tensor parallelism gives each rank a slice of the heads (head_offset, total_heads): both tile
// paths compute every head alone, so a slice's outputs, gradients and dropout masks are the
// whole call's bits for those heads.
TEST(Attention, HeadSlicesGiveTheWholeCallsBitsInBothPrecisions) {
  const int64_t s = 70, b = 2, np = 4, hn = 16, half = np / 2;
  const Tensor q = random_tensor({s, b, np, hn}, 401), k = random_tensor({s, b, np, hn}, 402),
               v = random_tensor({s, b, np, hn}, 403), dout = random_tensor({s, b, np, hn}, 404);
  // Heads [first, first + half) of a [s, b, np, hn] tensor.
  auto heads = [&](const Tensor& t, int64_t first) {
    Tensor o = Tensor::empty({s, b, half, hn});
    for (int64_t r = 0; r < s * b; ++r)
      for (int64_t h = 0; h < half; ++h)
        for (int64_t c = 0; c < hn; ++c)
          o.data<float>()[(r * half + h) * hn + c] = t.data<float>()[(r * np + first + h) * hn + c];
    return o;
  };
  for (DType precision : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(precision));
    ops::AttentionSpec spec;
    spec.scale = 0.25f;
    spec.dropout = 0.1f;
    spec.seed = 5;
    spec.precision = precision;
    const Outputs whole = run_fast(Inputs{q, k, v, np, spec}, dout);
    for (int64_t first : {int64_t{0}, half}) {
      ops::AttentionSpec part = spec;
      part.head_offset = first;
      part.total_heads = np;
      const Outputs got =
          run_fast(Inputs{heads(q, first), heads(k, first), heads(v, first), half, part},
                   heads(dout, first));
      EXPECT_TRUE(allclose(got.out, heads(whole.out, first), 0, 0));
      EXPECT_TRUE(allclose(got.dq, heads(whole.dq, first), 0, 0));
      EXPECT_TRUE(allclose(got.dk, heads(whole.dk, first), 0, 0));
      EXPECT_TRUE(allclose(got.dv, heads(whole.dv, first), 0, 0));
    }
  }
}

// Past 8 MB of key tiles per thread the forward keeps one tile and loads it at each use: a
// sequence of 257 key tiles (16448 tokens, head size 64) in documents of 64 tokens, each of which
// sees only itself, gives every document the bits of a call on that document alone.
TEST(Attention, LongSequencesGiveEachDocumentItsOwnCallsBits) {
  const int64_t s = 16448, doc = 64, hn = 64;
  const Tensor q = random_tensor({s, 1, 1, hn}, 501), k = random_tensor({s, 1, 1, hn}, 502),
               v = random_tensor({s, 1, 1, hn}, 503), dout = random_tensor({s, 1, 1, hn}, 504);
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < s; i += doc) starts.push_back(i);
  auto rows = [&](const Tensor& t, int64_t first) {
    Tensor o = Tensor::empty({doc, 1, 1, hn});
    std::copy(t.data<float>() + first * hn, t.data<float>() + (first + doc) * hn, o.data<float>());
    return o;
  };
  for (DType precision : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(precision));
    ops::AttentionSpec spec;
    spec.scale = 0.125f;
    spec.precision = precision;
    ops::AttentionSpec whole_spec = spec;
    whole_spec.doc_start = doc_starts(1, s, {starts});
    const Outputs whole = run_fast(Inputs{q, k, v, 1, whole_spec}, dout);
    for (int64_t first : {int64_t{0}, s / 2 / doc * doc, s - doc}) {
      const Outputs one = run_fast(Inputs{rows(q, first), rows(k, first), rows(v, first), 1, spec},
                                   rows(dout, first));
      EXPECT_TRUE(allclose(rows(whole.out, first), one.out, 0, 0)) << first;
      EXPECT_TRUE(allclose(rows(whole.dq, first), one.dq, 0, 0)) << first;
      EXPECT_TRUE(allclose(rows(whole.dk, first), one.dk, 0, 0)) << first;
      EXPECT_TRUE(allclose(rows(whole.dv, first), one.dv, 0, 0)) << first;
    }
  }
}

// ---- the largest score per head (AttentionSpec::max_logit: --qk-clip's statistic) -----------

// max_logit[h] after one forward from -inf: the largest scale q . k + bias over every pair head h
// sees, against the reference's f64 scores. f32: the scores are hn-term f32 dot products of O(1)
// inputs (rounding ~1e-6 of the O(3) scores); bound 1e-5 absolute and relative. The f64 kernel:
// its f64 score stored in the f32 statistic, rounded once (half an f32 ulp, 6e-8; bound 1.2e-7
// relative). bf16 tiles (AVX-512 BF16 CPUs): exact bf16 products summed in f32, against the
// reference on the bf16-rounded q and k, the same 1e-5.
TEST(Attention, MaxLogitIsEachHeadsLargestVisibleScore) {
  struct Case {
    int64_t sq, skv, b, np, ng, hn;
    bool causal;
    int64_t q_offset, window;
    bool docs, padding, bias;
  };
  const Case cases[] = {{99, 99, 2, 4, 2, 64, true, 0, -1, false, false, false},
                        {130, 130, 1, 2, 2, 16, true, 0, 20, true, false, false},
                        {70, 150, 2, 2, 1, 32, false, 0, -1, false, true, false},
                        {37, 101, 1, 4, 4, 16, true, 64, -1, false, false, false},
                        {64, 64, 2, 2, 2, 16, true, 0, -1, false, false, true}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE("sq " + std::to_string(c.sq) + " skv " + std::to_string(c.skv));
    Inputs in = random_inputs(c.sq, c.skv, c.b, c.ng, c.np / c.ng, c.hn, ++seed);
    in.spec.causal = c.causal;
    in.spec.q_offset = c.q_offset;
    in.spec.window = c.window;
    if (c.docs) in.spec.doc_start = doc_starts(c.b, c.sq, {{0, 50, 90}});
    if (c.padding) {  // sequence 1 keeps only its first 40 keys
      in.spec.key_valid = Tensor::empty({c.b, c.skv}, DType::kI32);
      for (int64_t i = 0; i < c.b * c.skv; ++i)
        in.spec.key_valid.data<int32_t>()[i] = i / c.skv == 0 || i % c.skv < 40 ? 1 : 0;
    }
    if (c.bias) in.spec.bias = random_tensor({1, c.np, c.sq, c.skv}, ++seed, 2.0);
    auto max_logit = [&](const Inputs& x, DType dtype, DType precision) {
      Inputs run{x.q.to(dtype), x.k.to(dtype), x.v.to(dtype), x.groups, x.spec};
      if (run.spec.bias.defined()) run.spec.bias = run.spec.bias.to(dtype);
      run.spec.precision = precision;
      run.spec.max_logit = Tensor::full({c.np}, kNegInf, DType::kF32);
      Tensor out = Tensor::empty({c.sq, c.b, c.np, c.hn}, dtype);
      Tensor lse = Tensor::empty({c.b, c.np, c.sq}, dtype);
      ops::attention_forward(out, lse, ops::attention_view(run.q, x.groups),
                             ops::attention_view(run.k, x.groups),
                             ops::attention_view(run.v, x.groups), run.spec);
      return run.spec.max_logit;
    };
    const Tensor want = ref::attention(f64(in.q), f64(in.k), f64(in.v), as_f64(in.spec)).max_score;
    EXPECT_TRUE(allclose(max_logit(in, DType::kF32, DType::kF32), want, 1e-5, 1e-5)) << "f32";
    EXPECT_TRUE(allclose(max_logit(in, DType::kF64, DType::kF64), want, 0, 1.2e-7)) << "f64";
    auto rounded = [](const Tensor& x) { return x.to(DType::kBF16).to(DType::kF32); };
    Inputs r{rounded(in.q), rounded(in.k), in.v, in.groups, in.spec};
    const Tensor want_bf16 = ref::attention(f64(r.q), f64(r.k), f64(r.v), as_f64(r.spec)).max_score;
    EXPECT_TRUE(allclose(max_logit(r, DType::kF32, DType::kBF16), want_bf16, 1e-5, 1e-5))
        << "bf16 tiles";
    // The reference's own definition, checked by brute force on one head: the largest visible
    // score (every case leaves head 0 of sequence 0 some visible key).
    EXPECT_GT(want.item(0), kNegInf);
  }
}

// The statistic is raised, never lowered: a second call (the other half of the keys, another
// micro-batch) leaves the larger of the two; a head no row of which sees any key keeps what it
// had.
TEST(Attention, MaxLogitIsRaisedAcrossCalls) {
  const int64_t s = 150, b = 2, ng = 2, qpg = 2, np = ng * qpg, hn = 16, split = 70;
  Inputs full = random_inputs(s, s, b, ng, qpg, hn, 950);
  Tensor whole = Tensor::full({np}, kNegInf, DType::kF32);
  Tensor halves = Tensor::full({np}, kNegInf, DType::kF32);
  auto forward = [&](const Tensor& k, const Tensor& v, int64_t kv_offset, const Tensor& acc) {
    ops::AttentionSpec spec = full.spec;
    spec.kv_offset = kv_offset;
    spec.max_logit = acc;
    Tensor out = Tensor::empty({s, b, np, hn}), lse = Tensor::empty({b, np, s});
    ops::attention_forward(out, lse, ops::attention_view(full.q, ng), ops::attention_view(k, ng),
                           ops::attention_view(v, ng), spec);
  };
  forward(full.k, full.v, 0, whole);
  forward(full.k.slice0(0, split).clone(), full.v.slice0(0, split).clone(), 0, halves);
  forward(full.k.slice0(split, s).clone(), full.v.slice0(split, s).clone(), split, halves);
  // Each score is the same hn-term product in either call (1e-6: f32 tiles may sum it in
  // another order at another column).
  EXPECT_TRUE(allclose(halves, whole, 1e-6, 1e-6));
  // A larger value already there stays; the others are raised to the call's.
  Tensor seeded = Tensor::full({np}, kNegInf, DType::kF32);
  seeded.data<float>()[1] = 1e6f;
  forward(full.k, full.v, 0, seeded);
  EXPECT_EQ(seeded.item(1), 1e6);
  EXPECT_EQ(seeded.item(0), whole.item(0));
  // Every key padding: no row sees a key, nothing is raised.
  ops::AttentionSpec none = full.spec;
  none.key_valid = Tensor::zeros({b, s}, DType::kI32);
  none.max_logit = Tensor::full({np}, kNegInf, DType::kF32);
  Tensor out = Tensor::empty({s, b, np, hn}), lse = Tensor::empty({b, np, s});
  ops::attention_forward(out, lse, ops::attention_view(full.q, ng), ops::attention_view(full.k, ng),
                         ops::attention_view(full.v, ng), none);
  for (int64_t h = 0; h < np; ++h) EXPECT_EQ(none.max_logit.item(h), kNegInf);
  // A wrong shape or dtype is refused.
  ops::AttentionSpec bad = full.spec;
  for (const Tensor& wrong :
       {Tensor::full({np + 1}, kNegInf, DType::kF32), Tensor::full({np}, kNegInf, DType::kF64)}) {
    bad.max_logit = wrong;
    EXPECT_THROW(ops::attention_forward(out, lse, ops::attention_view(full.q, ng),
                                        ops::attention_view(full.k, ng),
                                        ops::attention_view(full.v, ng), bad),
                 InvalidArgument);
  }
}

TEST(Attention, RefusesMismatchedViews) {
  Inputs in = random_inputs(4, 4, 1, 2, 1, 4, 90);
  Tensor out = Tensor::empty({4, 1, 2, 4}), lse = Tensor::empty({1, 2, 4});
  const Tensor short_k = random_tensor({4, 1, 2, 3}, 91);  // hn 3, q's is 4
  EXPECT_THROW(ops::attention_forward(out, lse, ops::attention_view(in.q, 2),
                                      ops::attention_view(short_k, 2), ops::attention_view(in.v, 2),
                                      in.spec),
               InvalidArgument);
  ops::AttentionSpec bad = in.spec;
  bad.bias = random_tensor({1, 2, 4, 5}, 92);  // skv is 4
  EXPECT_THROW(
      ops::attention_forward(out, lse, ops::attention_view(in.q, 2), ops::attention_view(in.k, 2),
                             ops::attention_view(in.v, 2), bad),
      InvalidArgument);
}

}  // namespace
}  // namespace megatron
