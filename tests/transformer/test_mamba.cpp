// Hybrid Mamba models' pieces (transformer/mamba): Megatron's layer allocation; the scan against
// the SSD "attention" form of the same recurrence; carried state (generation) against one pass;
// the kernels' backward (with the chunked recomputation) and the mixer and hybrid layers by
// finite differences in fp64; packed documents (Megatron's seq_idx): the scan and convolution
// restart at each document (against the dual form and the convolution's sum restricted to the
// document), forward and backward, and multi-token prediction's roll stays inside each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "comm/process_group.h"
#include "models/gpt/gpt_flops.h"
#include "models/gpt/mtp.h"
#include "models/mamba/mamba_spec.h"
#include "testing/layer_gradients.h"
#include "testing/testing.h"
#include "transformer/mamba/hybrid_pattern.h"
#include "transformer/mamba/mamba_config.h"
#include "transformer/mamba/mamba_mixer.h"
#include "transformer/mamba/ssm_kernels.h"
#include "transformer/transformer_layer.h"

namespace megatron {
namespace {

// Megatron's allocate_layers (core_v0.14.0, run on each case) gives these patterns.
TEST(HybridAllocation, MatchesMegatron) {
  struct Case {
    int64_t n;
    double attention, mlp;
    const char* want;
  };
  const Case cases[] = {
      {9, 0.0, 0.0, "MMMMMMMMM"},
      {8, 0.25, 0.0, "MM*MM*MM"},
      {10, 0.1, 0.5, "M-M--*M-M-"},
      {24, 0.08, 0.5, "M-M-M--*M-M-M-M-*M--M-M-"},
      {52, 0.08, 0.5, "M-M-M--M-M*-M-M-M--M*-M-M-M-M-M*--M-M-M-M*-M--M-M-M-"},
      {12, 1.0 / 3, 1.0 / 3, "M-*M*-M*-*M-"},
      {5, 0.5, 0.0, "M*M*M"},
      {6, 0.0, 0.5, "M-M-M-"},
      {7, 0.3, 0.3, "MM*-*M-"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(allocate_hybrid_layers(c.n, c.attention, c.mlp, ""), c.want)
        << c.n << " " << c.attention << " " << c.mlp;
}

TEST(HybridAllocation, OverrideRules) {
  EXPECT_EQ(allocate_hybrid_layers(4, 0, 0, "M*-M"), "M*-M");
  // With a ratio the override must hold as many of each type: MM*MM*MM has 2 '*'.
  EXPECT_EQ(allocate_hybrid_layers(8, 0.25, 0, "*MMMMMM*"), "*MMMMMM*");
  EXPECT_THROW(allocate_hybrid_layers(8, 0.25, 0, "*MMMMMMM"), InvalidArgument);
  EXPECT_THROW(allocate_hybrid_layers(4, 0, 0, "M*M"), InvalidArgument);   // wrong length
  EXPECT_THROW(allocate_hybrid_layers(4, 0, 0, "M*XM"), InvalidArgument);  // unknown symbol
  // E (an MoE layer, Megatron core 0.16's symbol) counts as a type of its own: the ratios never
  // allocate one, so with a ratio a pattern holding E has the wrong counts.
  EXPECT_EQ(allocate_hybrid_layers(4, 0, 0, "M*EM"), "M*EM");
  EXPECT_THROW(allocate_hybrid_layers(4, 0.25, 0, "M*EM"), InvalidArgument);
  EXPECT_THROW(allocate_hybrid_layers(4, 0.6, 0.6, ""), InvalidArgument);  // ratios above 1
}

// Megatron core 0.17's unified pattern (parse_hybrid_pattern's docstring examples): '|' cuts the
// main pattern into pipeline segments, each "/<mtp>" is one MTP depth of identical layers.
TEST(HybridPattern, ParsesMegatronsUnifiedForm) {
  const char* f = "--hybrid-layer-pattern";
  HybridPattern p = parse_hybrid_pattern("M*M*", f);
  EXPECT_EQ(p.main, "M*M*");
  EXPECT_EQ(p.segments, (std::vector<int64_t>{4}));
  EXPECT_FALSE(p.has_pipes());
  EXPECT_EQ(p.mtp, "");
  EXPECT_EQ(p.mtp_depths, 0);
  p = parse_hybrid_pattern("M-M-|M-M*-/MM/MM", f);
  EXPECT_EQ(p.main, "M-M-M-M*-");
  EXPECT_EQ(p.segments, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(p.mtp, "MM");
  EXPECT_EQ(p.mtp_depths, 2);
  p = parse_hybrid_pattern("MMMM/*M/*M/*M", f);
  EXPECT_EQ(p.mtp, "*M");
  EXPECT_EQ(p.mtp_depths, 3);
  // A separator with nothing after it: no MTP (Megatron's rule); an empty segment is a stage
  // without layers.
  p = parse_hybrid_pattern("M*M*/", f);
  EXPECT_EQ(p.mtp_depths, 0);
  EXPECT_EQ(parse_hybrid_pattern("M||*", f).segments, (std::vector<int64_t>{1, 0, 1}));
  auto refusal = [&](const std::string& text) -> std::string {
    try {
      parse_hybrid_pattern(text, f);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(refusal("M*/*E/E*").find("all MTP patterns must be identical"), std::string::npos);
  EXPECT_NE(refusal("M*/*|E").find("'|' separates pipeline segments"), std::string::npos);
  EXPECT_NE(refusal("MG*").find("'G' (gated DeltaNet) is not implemented"), std::string::npos);
  EXPECT_NE(refusal("M+").find("'+' (MLA) is not implemented"), std::string::npos);
  EXPECT_NE(refusal("M*/D").find("'D' (DeepSeek sparse attention)"), std::string::npos);
  EXPECT_NE(refusal("MX").find("'X' in the main pattern is not a layer symbol"), std::string::npos);
  // Megatron's legacy --mtp-hybrid-override-pattern: appended once per depth, unless the
  // pattern already has its MTP part.
  EXPECT_EQ(with_legacy_mtp_pattern("M*", "*E", 2), "M*/*E/*E");
  EXPECT_EQ(with_legacy_mtp_pattern("M*/-", "*E", 2), "M*/-");
  EXPECT_EQ(with_legacy_mtp_pattern("M*", "*E", 0), "M*");
}

// Small scan problem with random inputs (fp64); head_dim 5 takes both the 4-channel blocks and
// the one-channel remainder of the backward.
struct ScanProblem {
  ssm::ScanShape sh;
  std::vector<double> x, dt, A_log, B, C, D, bias;
  explicit ScanProblem(int64_t s, int64_t chunk) {
    sh = {.s = s, .b = 2, .heads = 4, .head_dim = 5, .groups = 2, .state = 5, .chunk = chunk};
    uint64_t seed = 17;
    auto fill = [&](std::vector<double>& v, int64_t n, double lo, double hi) {
      const Tensor t = testing::random_tensor({n}, ++seed, 1.0, DType::kF64);
      v.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        v[static_cast<size_t>(i)] = lo + (hi - lo) * (t.data<double>()[i] + 1) / 2;
    };
    const int64_t rows = s * sh.b;
    fill(x, rows * sh.heads * sh.head_dim, -1, 1);
    fill(dt, rows * sh.heads, -3, 1);
    fill(A_log, sh.heads, 0, 2.7);
    fill(B, rows * sh.groups * sh.state, -1, 1);
    fill(C, rows * sh.groups * sh.state, -1, 1);
    fill(D, sh.heads, 0.5, 1.5);
    fill(bias, sh.heads, -1, 1);
  }
  std::vector<double> forward(double* state = nullptr, double* kept = nullptr) const {
    std::vector<double> y(x.size());
    ssm::scan_forward<double>(sh, x.data(), dt.data(), A_log.data(), B.data(), C.data(), D.data(),
                              bias.data(), y.data(), state, kept);
    return y;
  }
};

double softplus(double v) {
  return v > 20 ? v : std::log1p(std::exp(v));
}

// The same recurrence written as Mamba-2's state-space duality (the "attention" form), for
// channel q of head h of sequence i at position t, summed from position `first`:
// y_t = sum_{first <= u <= t} (C_t . B_u) exp(A sum_{k=u+1..t} dt_k) dt_u x_u + D x_t.
double dual_form(const ScanProblem& p, int64_t i, int64_t h, int64_t t, int64_t q, int64_t first) {
  const auto& sh = p.sh;
  const int64_t H = sh.heads, P = sh.head_dim, N = sh.state, G = sh.groups, g = h / (H / G);
  const double A = -std::exp(p.A_log[h]);
  auto dts = [&](int64_t k) { return softplus(p.dt[(k * sh.b + i) * H + h] + p.bias[h]); };
  double y = p.D[h] * p.x[((t * sh.b + i) * H + h) * P + q];
  for (int64_t u = first; u <= t; ++u) {
    double cb = 0, decay = 0;
    for (int64_t n = 0; n < N; ++n)
      cb += p.C[((t * sh.b + i) * G + g) * N + n] * p.B[((u * sh.b + i) * G + g) * N + n];
    for (int64_t k = u + 1; k <= t; ++k) decay += dts(k);
    y += cb * std::exp(A * decay) * dts(u) * p.x[((u * sh.b + i) * H + h) * P + q];
  }
  return y;
}

TEST(MambaScan, RecurrenceEqualsDualForm) {
  const ScanProblem p(7, 3);
  const std::vector<double> y = p.forward();
  const auto& sh = p.sh;
  for (int64_t i = 0; i < sh.b; ++i)
    for (int64_t h = 0; h < sh.heads; ++h)
      for (int64_t t = 0; t < sh.s; ++t)
        for (int64_t q = 0; q < sh.head_dim; ++q) {
          // Both sides are fp64 sums of a few dozen O(1) terms.
          EXPECT_NEAR(y[((t * sh.b + i) * sh.heads + h) * sh.head_dim + q],
                      dual_form(p, i, h, t, q, 0), 1e-12);
        }
}

// Generation: the scan and the convolution over positions [0, 3) then [3, 7), carrying the state
// and the convolution's history, equal one pass over [0, 7).
TEST(MambaScan, CarriedStateEqualsOnePass) {
  const ScanProblem p(7, 64);
  const std::vector<double> whole = p.forward();
  const auto& sh = p.sh;
  const int64_t per_row_x = sh.heads * sh.head_dim, per_row_bc = sh.groups * sh.state;
  std::vector<double> state(static_cast<size_t>(sh.b * per_row_x * sh.state), 0.0);
  std::vector<double> got;
  for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, 3}, {3, 7}}) {
    ScanProblem part = p;
    part.sh.s = t1 - t0;
    auto cut = [&](const std::vector<double>& v, int64_t per_row) {
      return std::vector<double>(v.begin() + t0 * sh.b * per_row, v.begin() + t1 * sh.b * per_row);
    };
    part.x = cut(p.x, per_row_x);
    part.dt = cut(p.dt, sh.heads);
    part.B = cut(p.B, per_row_bc);
    part.C = cut(p.C, per_row_bc);
    const std::vector<double> y = part.forward(state.data());
    got.insert(got.end(), y.begin(), y.end());
  }
  ASSERT_EQ(got.size(), whole.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], whole[k], 1e-12);

  // The convolution: width 4, 3 channels.
  const ssm::ConvShape cs{.s = 7, .b = 2, .channels = 3, .width = 4};
  const Tensor in = testing::random_tensor({7 * 2 * 3}, 3, 1.0, DType::kF64);
  const Tensor w = testing::random_tensor({12}, 4, 1.0, DType::kF64);
  const Tensor bias = testing::random_tensor({3}, 5, 1.0, DType::kF64);
  std::vector<double> one(42), parts(42), hist(2 * 3 * 3, 0.0), next(hist.size());
  ssm::conv_silu_forward<double>(cs, in.data<double>(), nullptr, w.data<double>(),
                                 bias.data<double>(), one.data());
  for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {3, 7}}) {
    const ssm::ConvShape part{.s = t1 - t0, .b = 2, .channels = 3, .width = 4};
    const double* src = in.data<double>() + t0 * 6;
    ssm::conv_silu_forward<double>(part, src, hist.data(), w.data<double>(), bias.data<double>(),
                                   parts.data() + t0 * 6);
    ssm::conv_history<double>(part, src, hist.data(), next.data());
    hist = next;
  }
  for (size_t k = 0; k < one.size(); ++k) EXPECT_NEAR(parts[k], one[k], 1e-14);
}

// L = sum(dy * y) as a function of one input array, and its central difference.
double fd(const std::function<double()>& loss, double& v) {
  const double h = 1e-6, keep = v;
  v = keep + h;
  const double up = loss();
  v = keep - h;
  const double down = loss();
  v = keep;
  return (up - down) / (2 * h);
}

// The scan's backward, with chunks of 2 positions (the kept states and the recomputation inside
// each chunk are exercised), against central differences of every input. Tolerance: the check
// in testing/layer_gradients.h (step 1e-6 in fp64: ~1e-9 error on O(1) values).
void check_scan_backward(ScanProblem& p) {
  const Tensor dyt =
      testing::random_tensor({static_cast<int64_t>(p.x.size())}, 99, 1.0, DType::kF64);
  const double* dy = dyt.data<double>();
  auto loss = [&] {
    const std::vector<double> y = p.forward();
    double l = 0;
    for (size_t k = 0; k < y.size(); ++k) l += dy[k] * y[k];
    return l;
  };
  std::vector<double> kept(static_cast<size_t>(p.sh.kept_states()));
  p.forward(nullptr, kept.data());
  std::vector<double> dx(p.x.size()), ddt(p.dt.size()), dB(p.B.size()), dC(p.C.size());
  std::vector<double> dA(p.A_log.size(), 0.0), dD(dA.size(), 0.0), dbias(dA.size(), 0.0);
  ssm::scan_backward<double>(p.sh, p.x.data(), p.dt.data(), p.A_log.data(), p.B.data(), p.C.data(),
                             p.D.data(), p.bias.data(), kept.data(), dy, dx.data(), ddt.data(),
                             dB.data(), dC.data(), dA.data(), dD.data(), dbias.data());
  auto check = [&](const char* what, std::vector<double>& in, const std::vector<double>& grad) {
    for (size_t k = 0; k < in.size(); k += std::max<size_t>(1, in.size() / 25)) {
      const double want = fd(loss, in[k]);
      EXPECT_NEAR(grad[k], want, 1e-7 + 1e-5 * std::abs(want)) << what << "[" << k << "]";
    }
  };
  check("x", p.x, dx);
  check("dt", p.dt, ddt);
  check("B", p.B, dB);
  check("C", p.C, dC);
  check("A_log", p.A_log, dA);
  check("D", p.D, dD);
  check("dt_bias", p.bias, dbias);
}

TEST(MambaScan, BackwardMatchesFiniteDifferences) {
  ScanProblem p(5, 2);
  check_scan_backward(p);
}

// Packed documents in [b, s] = [2, 7]: sequence 0 holds [0, 3) and [3, 7), sequence 1 [0, 1),
// [1, 4) and [4, 7) (a one-token document; with chunks of 2 positions a start inside a chunk and
// one on a chunk's first position, where the kept state is the previous document's).
const std::vector<int32_t> kPackedStarts = {0, 0, 0, 3, 3, 3, 3, 0, 1, 1, 1, 4, 4, 4};

// The dual form of RecurrenceEqualsDualForm with the sum over u restricted to the document of t,
// and the convolution's sum restricted to it: each document is its own sequence.
TEST(MambaScan, PackedDocumentsRestartTheScanAndTheConvolution) {
  ScanProblem p(7, 3);
  const std::vector<double> whole = p.forward();
  p.sh.doc_start = kPackedStarts.data();
  const std::vector<double> y = p.forward();
  const auto& sh = p.sh;
  double moved = 0;  // the largest change a restart makes
  for (int64_t i = 0; i < sh.b; ++i)
    for (int64_t h = 0; h < sh.heads; ++h)
      for (int64_t t = 0; t < sh.s; ++t)
        for (int64_t q = 0; q < sh.head_dim; ++q) {
          const int64_t at = ((t * sh.b + i) * sh.heads + h) * sh.head_dim + q;
          // As RecurrenceEqualsDualForm, summed over the token's document.
          EXPECT_NEAR(y[at], dual_form(p, i, h, t, q, kPackedStarts[i * sh.s + t]), 1e-12);
          moved = std::max(moved, std::abs(y[at] - whole[at]));
        }
  EXPECT_GT(moved, 1e-3);  // the restarts change the output

  // The convolution: width 4, 3 channels; position t reads positions >= its document's start.
  const int64_t S = 7, Bn = 2, Cn = 3, K = 4;
  const ssm::ConvShape cs{
      .s = S, .b = Bn, .channels = Cn, .width = K, .doc_start = kPackedStarts.data()};
  const Tensor in = testing::random_tensor({S * Bn * Cn}, 3, 1.0, DType::kF64);
  const Tensor w = testing::random_tensor({Cn * K}, 4, 1.0, DType::kF64);
  const Tensor bias = testing::random_tensor({Cn}, 5, 1.0, DType::kF64);
  std::vector<double> out(static_cast<size_t>(S * Bn * Cn));
  ssm::conv_silu_forward<double>(cs, in.data<double>(), nullptr, w.data<double>(),
                                 bias.data<double>(), out.data());
  for (int64_t t = 0; t < S; ++t)
    for (int64_t i = 0; i < Bn; ++i)
      for (int64_t c = 0; c < Cn; ++c) {
        double pre = bias.data<double>()[c];
        for (int64_t k = 0; k < K; ++k) {
          const int64_t tt = t + k - (K - 1);
          if (tt >= kPackedStarts[i * S + t])
            pre += w.data<double>()[c * K + k] * in.data<double>()[(tt * Bn + i) * Cn + c];
        }
        EXPECT_NEAR(out[(t * Bn + i) * Cn + c], pre / (1 + std::exp(-pre)), 1e-14);
      }
}

TEST(MambaScan, PackedBackwardMatchesFiniteDifferences) {
  ScanProblem p(7, 2);
  p.sh.doc_start = kPackedStarts.data();
  check_scan_backward(p);
}

struct SelfGroup {
  std::shared_ptr<ProcessGroup> group = make_self_process_group();
  TensorParallelContext tp() const { return TensorParallelContext{group.get(), false, {}}; }
};

TransformerConfig hybrid_config(const std::string& pattern) {
  TransformerConfig c;
  c.num_layers = static_cast<int64_t>(pattern.size());
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.ffn_hidden_size = 12;
  c.seq_length = 6;
  c.vocab_size = 16;
  c.padded_vocab_size = 16;
  c.normalization = Normalization::kRMSNorm;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kNone;
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0;
  c.init_method_std = 0.4;  // large enough that every path carries signal
  c.compute_dtype = DType::kF64;
  c.mamba.layers = pattern;
  c.mamba.state_dim = 4;
  c.mamba.head_dim = 4;  // d_inner 16: 4 heads
  c.mamba.num_groups = 2;
  if (pattern.find('E') != std::string::npos) {  // the E layers' MoE: 4 experts, top 2
    c.moe.num_experts = 4;
    c.moe.ffn_hidden_size = 6;
    for (char t : pattern) c.moe.layer_pattern.push_back(t == 'E' ? 1 : 0);
  }
  c.finalize();
  return c;
}

// The mixer (projections, convolution, scan, gated norm) and a hybrid model's four layer types
// with hidden dropout, by finite differences in fp64 (testing/layer_gradients.h).
TEST(MambaLayers, GradientsMatchFiniteDifferences) {
  SelfGroup g;
  const TransformerConfig cfg = hybrid_config("M*-E");
  const Tensor x = testing::random_tensor({6, 2, 8}, 7, 1.0, DType::kF64);
  {
    SCOPED_TRACE("mixer");
    MambaMixer mixer("mixer", cfg, 0, g.tp());
    MambaMixer::Ctx ctx;
    std::vector<Param*> ps;
    mixer.collect(ps);
    testing::check_layer_gradients({ps,
                                    [&](const Tensor& in) {
                                      ctx = {};
                                      return mixer.forward(in, Tensor(), ctx, ForwardMode{});
                                    },
                                    [&](const Tensor& dy) { return mixer.backward(dy, ctx); }},
                                   x, 11);
  }
  {
    // Packed documents: the convolution's and the scan's restarts in backward (sequence 0:
    // [0, 2), [2, 6); sequence 1: [0, 3), [3, 4), [4, 6)).
    SCOPED_TRACE("mixer, packed documents");
    MambaMixer mixer("mixer", cfg, 0, g.tp());
    MambaMixer::Ctx ctx;
    std::vector<Param*> ps;
    mixer.collect(ps);
    Tensor docs = Tensor::empty({2, 6}, DType::kI32);
    const int32_t starts[] = {0, 0, 2, 2, 2, 2, 0, 0, 0, 3, 4, 4};
    std::copy(std::begin(starts), std::end(starts), docs.data<int32_t>());
    testing::check_layer_gradients({ps,
                                    [&](const Tensor& in) {
                                      ctx = {};
                                      return mixer.forward(in, docs, ctx, ForwardMode{});
                                    },
                                    [&](const Tensor& dy) { return mixer.backward(dy, ctx); }},
                                   x, 12);
  }
  for (int64_t l = 0; l < 4; ++l) {
    SCOPED_TRACE("layer type " + std::string(1, cfg.mamba.layers[static_cast<size_t>(l)]));
    TransformerLayer layer("layer", cfg, l, g.tp());
    EXPECT_EQ(layer.mixer != nullptr, l == 0);
    EXPECT_EQ(layer.self_attention != nullptr, l == 1);
    EXPECT_EQ(layer.mlp != nullptr, l == 2);
    EXPECT_EQ(layer.moe != nullptr, l == 3);
    EXPECT_EQ(layer.input_layernorm != nullptr, l == 1);
    EXPECT_EQ(layer.pre_mlp_layernorm != nullptr, l >= 2);
    TransformerLayer::Ctx ctx;
    std::vector<Param*> ps;
    layer.collect(ps);
    const ForwardMode training{true, 5, 9};
    testing::check_layer_gradients({ps,
                                    [&](const Tensor& in) {
                                      ctx = {};
                                      return layer.forward(in, TokenLayout{}, ctx, training);
                                    },
                                    [&](const Tensor& dy) { return layer.backward(dy, ctx); }},
                                   x, 13 + static_cast<uint64_t>(l));
  }
}

// Megatron's names and shapes (conv1d.weight flattened to [channels, d_conv]).
TEST(MambaLayers, ParameterNamesAndShapes) {
  SelfGroup g;
  const TransformerConfig cfg = hybrid_config("M");
  TransformerLayer layer("decoder.layers.0", cfg, 0, g.tp());
  std::vector<Param*> ps;
  layer.collect(ps);
  std::vector<std::pair<std::string, Shape>> got;
  for (const Param* p : ps) got.emplace_back(p->name, p->shape);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"decoder.layers.0.norm.weight", {8}},
      {"decoder.layers.0.mixer.in_proj.weight", {2 * 16 + 2 * 2 * 4 + 4, 8}},
      {"decoder.layers.0.mixer.conv1d.weight", {16 + 2 * 2 * 4, 4}},
      {"decoder.layers.0.mixer.conv1d.bias", {16 + 2 * 2 * 4}},
      {"decoder.layers.0.mixer.A_log", {4}},
      {"decoder.layers.0.mixer.D", {4}},
      {"decoder.layers.0.mixer.dt_bias", {4}},
      {"decoder.layers.0.mixer.norm.weight", {16}},
      {"decoder.layers.0.mixer.out_proj.weight", {8, 16}},
  };
  EXPECT_EQ(got, want);
}

// An E layer is the MoE half of a transformer layer under Megatron's names; a config whose MoE
// layers are not exactly its E layers is refused (model_config sets one from the other).
TEST(MambaLayers, MoeLayersAreTheELayers) {
  SelfGroup g;
  const TransformerConfig cfg = hybrid_config("ME");
  EXPECT_FALSE(cfg.moe.is_moe_layer(0));
  EXPECT_TRUE(cfg.moe.is_moe_layer(1));
  TransformerLayer layer("decoder.layers.1", cfg, 1, g.tp());
  std::vector<Param*> ps;
  layer.collect(ps);
  ASSERT_GE(ps.size(), 2u);
  EXPECT_EQ(ps[0]->name, "decoder.layers.1.pre_mlp_layernorm.weight");
  EXPECT_EQ(ps[1]->name, "decoder.layers.1.mlp.router.weight");
  EXPECT_EQ(ps[1]->shape, (Shape{4, 8}));
  auto refusal = [](TransformerConfig c) -> std::string {
    try {
      c.finalize();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  TransformerConfig bad = hybrid_config("ME");
  bad.moe.layer_pattern.clear();  // every layer MoE, the M layer too
  EXPECT_NE(refusal(bad).find("layer 0 of the hybrid pattern 'ME' is an MoE layer but not E"),
            std::string::npos)
      << refusal(bad);
  bad.moe.layer_pattern = {1, 0};
  EXPECT_NE(refusal(bad).find("layer 0 of the hybrid pattern 'ME' is an MoE layer but not E"),
            std::string::npos);
  bad.moe.layer_pattern = {0, 0, 1};  // longer than the pattern: layer 1 is still not MoE
  EXPECT_NE(refusal(bad).find("layer 1 of the hybrid pattern 'ME' is E but not an MoE layer"),
            std::string::npos);
}

// The FLOPs per iteration of Megatron core 0.16's hybrid_flops, written out for "ME": the Mamba
// layer (in_proj, 7 d_in N per token for the scan, out_proj), the MoE layer (4 B s h per unit of
// routed width, top-2 of 6 plus 5 shared; not gated), the logits; forward x 3.
TEST(HybridFlops, CountsTheMoeLayersRoutedAndSharedExperts) {
  TransformerConfig c = hybrid_config("ME");
  c.moe.shared_expert_intermediate_size = 5;
  const double B = 3, s = 6, h = 8, d_in = 16, heads = 4, gn = 2 * 4, N = 4, V = 16;
  const double mamba =
      2 * B * s * h * (2 * d_in + 2 * gn + heads) + 7 * B * s * d_in * N + 2 * B * s * d_in * h;
  const double moe = 4 * B * s * h * (6 * 2 + 5);
  const double want = 3 * (mamba + moe + 2 * B * s * h * V);
  EXPECT_NEAR(hybrid_flops_per_iteration(c, 3), want, 1e-12 * want);
}

// LatentMoE (core 0.19's moe_layer_flops with moe_latent_size): the routed experts at the latent
// width, 4 B s h L for the two projections, the shared experts at h; "ME" with L = 5.
TEST(HybridFlops, CountsLatentMoeAtTheLatentWidth) {
  TransformerConfig c = hybrid_config("ME");
  c.moe.shared_expert_intermediate_size = 4;
  c.finalize();
  const double plain = hybrid_flops_per_iteration(c, 3);
  c.moe.latent_size = 5;
  const double B = 3, s = 6, h = 8, L = 5, f = 6, k = 2, shared = 4;
  // The same total minus the plain MoE term, plus the latent one (forward x 3).
  const double moe_plain = 4 * B * s * h * (f * k + shared);
  const double moe_latent = 4 * B * s * L * f * k + 4 * B * s * h * L + 4 * B * s * h * shared;
  const double want = plain + 3 * (moe_latent - moe_plain);
  EXPECT_NEAR(hybrid_flops_per_iteration(c, 3), want, 1e-12 * want);
}

// GPT's FLOPs with LatentMoE (core 0.19's num_floating_point_operations): per token and MoE
// layer the routed term 6 h (f k x) becomes 6 h (f k x L / h + 2 L), x = 2 (not gated), so the
// totals differ by B s layers 6 h (f k x (L / h - 1) + 2 L); nothing else changes.
TEST(GptFlops, LatentMoeTermsAreMegatrons) {
  TransformerConfig c = hybrid_config("*E");
  c.mamba = MambaConfig{};
  c.moe.layer_pattern.clear();  // every layer MoE
  c.moe.shared_expert_intermediate_size = 4;
  c.finalize();
  const double plain = model_flops_per_iteration(c, 3);
  c.moe.latent_size = 5;
  const double B = 3, s = 6, h = 8, L = 5, f = 6, k = 2, x = 2, layers = 2;
  const double want = plain + B * s * layers * 6 * h * (f * k * x * (L / h - 1) + 2 * L);
  EXPECT_NEAR(model_flops_per_iteration(c, 3), want, 1e-12 * want);
}

// A hybrid model's MTP depths (--hybrid-layer-pattern "ME/*E/*E"): depth k's layer j is layer
// number 2 + 2 k + j, its type the MTP pattern's; the E layers among them are MoE layers; the
// parameters take Megatron's names under mtp.layers.{k}.mtp_model_layer.layers.{j}.
TEST(HybridMtp, LayersNumbersTypesAndNames) {
  SelfGroup g;
  TransformerConfig c = hybrid_config("ME");
  c.mtp_num_layers = 2;
  c.mamba.mtp_layers = "*E";
  c.moe.layer_pattern = {0, 1, 0, 1, 0, 1};
  c.position_embedding = PositionEmbedding::kNone;
  c.finalize();
  EXPECT_EQ(c.layer_slots(), 6);
  const std::string types = {c.mamba.layer_type(0), c.mamba.layer_type(1), c.mamba.layer_type(2),
                             c.mamba.layer_type(3), c.mamba.layer_type(4), c.mamba.layer_type(5)};
  EXPECT_EQ(types, "ME*E*E");
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(c.is_moe_layer(l), l % 2 == 1) << l;
  MultiTokenPrediction mtp(c, g.tp());
  ASSERT_EQ(mtp.depths(), 2);
  ASSERT_EQ(mtp.layers[1]->layers.size(), 2u);
  EXPECT_EQ(mtp.layers[1]->layers[0]->layer_number(), 4);
  EXPECT_TRUE(mtp.layers[1]->layers[0]->self_attention != nullptr);
  EXPECT_TRUE(mtp.layers[1]->layers[1]->moe != nullptr);
  std::vector<Param*> ps;
  mtp.collect(ps);
  std::vector<std::string> names;
  for (const Param* p : ps) names.push_back(p->name);
  for (const char* want : {"mtp.layers.1.eh_proj.weight",
                           "mtp.layers.1.mtp_model_layer.layers.0.self_attention.linear_qkv.weight",
                           "mtp.layers.1.mtp_model_layer.layers.1.mlp.router.weight",
                           "mtp.layers.1.final_layernorm.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  // No MTP pattern with --mtp-num-layers: refused (Megatron builds no MTP block, silently).
  TransformerConfig bad = hybrid_config("ME");
  bad.mtp_num_layers = 1;
  try {
    bad.finalize();
    ADD_FAILURE() << "finalize accepted MTP depths without an MTP pattern";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs the MTP layers' pattern"), std::string::npos)
        << e.what();
  }
}

// Megatron's hybrid FLOPs count every MTP depth's layers (get_hybrid_layer_counts) and one more
// output layer per depth: "ME/-/-" adds two MLP layers and two logits terms to "ME"'s.
TEST(HybridFlops, CountsTheMtpDepths) {
  TransformerConfig c = hybrid_config("ME");
  const double base = hybrid_flops_per_iteration(c, 3);
  c.mtp_num_layers = 2;
  c.mamba.mtp_layers = "-";
  c.moe.layer_pattern = {0, 1, 0, 0};
  c.finalize();
  const double B = 3, s = 6, h = 8, V = 16, f = 12;
  const double mlp = 4 * (f / h) * B * s * h * h;
  const double want = base + 3 * (2 * mlp + 2 * (2 * B * s * h * V));
  EXPECT_NEAR(hybrid_flops_per_iteration(c, 3), want, 1e-12 * want);
}

// Multi-token prediction's roll with packed documents (kPackedStarts): each document's last
// position takes 0, as Megatron core 0.19's _roll_tensor_packed_seq; without documents the roll
// of the whole row (Megatron's roll_tensor).
TEST(HybridMtp, RollStaysInsideEachDocument) {
  Tensor x = Tensor::empty({2, 7}, DType::kI64), starts = Tensor::empty({2, 7}, DType::kI32);
  for (int64_t k = 0; k < 14; ++k) {
    x.data<int64_t>()[k] = 10 * (k / 7) + k % 7 + 1;
    starts.data<int32_t>()[k] = kPackedStarts[static_cast<size_t>(k)];
  }
  const ContextParallelContext none;
  const Tensor ends = document_ends(starts, none);
  const std::vector<int32_t> want_ends = {0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0};
  EXPECT_EQ(std::vector<int32_t>(ends.data<int32_t>(), ends.data<int32_t>() + 14), want_ends);
  const Tensor rolled = roll_left(x, none, ends);
  const std::vector<int64_t> want = {2, 3, 0, 5, 6, 7, 0, 0, 13, 14, 0, 16, 17, 0};
  EXPECT_EQ(std::vector<int64_t>(rolled.data<int64_t>(), rolled.data<int64_t>() + 14), want);
  const Tensor twice = roll_left(rolled, none, ends);  // depth 2: two places ahead, same document
  const std::vector<int64_t> want2 = {3, 0, 0, 6, 7, 0, 0, 0, 14, 0, 0, 17, 0, 0};
  EXPECT_EQ(std::vector<int64_t>(twice.data<int64_t>(), twice.data<int64_t>() + 14), want2);
  const Tensor plain = roll_left(x, none, Tensor());
  const std::vector<int64_t> whole = {2, 3, 4, 5, 6, 7, 0, 12, 13, 14, 15, 16, 17, 0};
  EXPECT_EQ(std::vector<int64_t>(plain.data<int64_t>(), plain.data<int64_t>() + 14), whole);
}

}  // namespace
}  // namespace megatron
