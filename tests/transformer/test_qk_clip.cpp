// MuonClip's qk-clip on the attention side (transformer/qk_clip.h, SelfAttention::max_logits and
// qk_clip_scales, parallel/row_scale.h):
// - QkClip's arithmetic against torch's (the values below were printed by PyTorch 1.13 on a CPU:
//   torch.clamp(100.0 / m, max=1.0) and torch.pow(eta, e) on tensors of the dtype);
// - the factors land on the right rows: each query group's queries and key (MLA: each head's
//   q_nope, q_pe and k_nope), never the values;
// - what the clip is for: after it, the same forward's largest score of a clipped group is eta
//   times the old one (the threshold for the group that set it), for grouped-query attention with
//   RoPE and for multi-latent attention, and the groups below the threshold are unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "parallel/row_scale.h"
#include "testing/testing.h"
#include "transformer/attention.h"
#include "transformer/qk_clip.h"

namespace megatron {
namespace {

constexpr int64_t kS = 24, kB = 2;

TEST(QkClip, TorchsArithmeticInF32AndBf16) {
  // m = 123.4, 100.3, 250, 7 with threshold 100: eta, eta^0.5, eta^0.3, eta^0.7 as torch gives
  // them. The f32 powers other than 0.5 may differ from torch's vectorised pow by an ulp (2e-7).
  struct Want {
    double m, eta, half, p3, p7;
    bool exceeds;
  };
  const Want f32[] = {
      {123.4, 0.8103727102279663, 0.9002070426940918, 0.9388699531555176, 0.8631362915039062, true},
      {100.3, 0.9970089197158813, 0.9985033273696899, 0.9991017580032349, 0.9979053139686584, true},
      {250.0, 0.4000000059604645, 0.6324555277824402, 0.7596578001976013, 0.5265529155731201, true},
      {7.0, 1.0, 1.0, 1.0, 1.0, false}};
  // The non-0.5 powers: within `pow_tol` of torch's (0: exactly).
  auto check = [](const QkClip& clip, const Want& w, double pow_tol) {
    SCOPED_TRACE(std::string(clip.dtype == DType::kF32 ? "f32" : "bf16") + " m " +
                 std::to_string(w.m));
    const float m = clip.round(w.m);
    EXPECT_EQ(clip.exceeds(m), w.exceeds);
    EXPECT_EQ(clip.eta(m), static_cast<float>(w.eta));
    EXPECT_EQ(clip.power(clip.eta(m), 0.5), static_cast<float>(w.half));
    EXPECT_NEAR(clip.power(clip.eta(m), 0.3), static_cast<float>(w.p3), pow_tol);
    EXPECT_NEAR(clip.power(clip.eta(m), 1 - 0.3), static_cast<float>(w.p7), pow_tol);
  };
  QkClip clip{.alpha = 0.5, .threshold = 100, .dtype = DType::kF32};
  for (const Want& w : f32) check(clip, w, 2e-7);
  // bf16: every step rounds to bf16, the exponent too (0.3 -> 0.30078125, which moves
  // 0.400390625^e across a rounding boundary: 0.7578125, where f32's exponent gives 0.76171875).
  const Want bf16[] = {{123.4, 0.8125, 0.90234375, 0.94140625, 0.86328125, true},
                       {100.3, 0.99609375, 0.99609375, 1.0, 0.99609375, true},
                       {250.0, 0.400390625, 0.6328125, 0.7578125, 0.52734375, true},
                       {7.0, 1.0, 1.0, 1.0, 1.0, false}};
  clip.dtype = DType::kBF16;
  for (const Want& w : bf16) check(clip, w, 0);
  // At the threshold nothing is clipped (torch's strict >).
  EXPECT_FALSE(clip.exceeds(100.0f));
}

TransformerConfig gqa_config() {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 32;
  c.seq_length = kS;
  c.vocab_size = 16;
  c.padded_vocab_size = 16;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.normalization = Normalization::kRMSNorm;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRope;
  c.init_method_std = 0.5;  // scores of O(10): room for a threshold between the groups
  c.track_max_logits = true;
  c.finalize();
  return c;
}

TransformerConfig mla_config() {
  TransformerConfig c = gqa_config();
  c.kv_channels = 0;
  c.num_query_groups = 0;
  c.mla.enabled = true;
  c.mla.q_lora_rank = 6;
  c.mla.kv_lora_rank = 6;
  c.mla.qk_head_dim = 4;
  c.mla.qk_pos_emb_head_dim = 4;
  c.mla.v_head_dim = 3;
  c.mla.yarn = false;
  c.finalize();
  return c;
}

struct Layer {
  TransformerConfig cfg;  // the layer keeps a reference to it
  std::shared_ptr<ProcessGroup> group = make_self_process_group();
  SelfAttention attn;
  std::unique_ptr<ParamSet> params;
  explicit Layer(const TransformerConfig& c)
      : cfg(c), attn("attn", cfg, 0, TensorParallelContext{group.get(), false, {}}) {
    std::vector<Param*> ps;
    attn.collect(ps);
    params = std::make_unique<ParamSet>(ps, DType::kF32);
    params->initialize(11);
  }
  // One training forward from reset statistics: each head's largest score.
  std::vector<float> max_logits(const Tensor& x) {
    attn.reset_max_logits();
    SelfAttention::Ctx ctx;
    TokenLayout layout;
    Tensor positions = Tensor::empty({kS, kB}, DType::kI64);
    for (int64_t i = 0; i < kS * kB; ++i) positions.data<int64_t>()[i] = i / kB;
    layout.positions = positions;
    attn.forward(x, layout, ctx, ForwardMode{true, 1, 0});
    const Tensor& m = attn.max_logits();
    std::vector<float> out;
    for (int64_t h = 0; h < m.numel(); ++h) out.push_back(static_cast<float>(m.item(h)));
    return out;
  }
};

// Eval forwards leave the statistic alone; training forwards raise it.
TEST(QkClip, OnlyTrainingForwardsKeepTheStatistic) {
  Layer l(gqa_config());
  const Tensor x = testing::random_tensor({kS, kB, 16}, 5);
  SelfAttention::Ctx ctx;
  l.attn.forward(x, TokenLayout{}, ctx, ForwardMode{});
  EXPECT_FALSE(l.attn.max_logits().defined());
  const std::vector<float> m = l.max_logits(x);
  ASSERT_EQ(m.size(), 4u);
  for (float v : m) EXPECT_TRUE(std::isfinite(v));
}

// The rows: linear_qkv [2 groups x (2 queries + key + value) x hn 4]; group 0 over the threshold,
// group 1 not: its rows keep 1, and so do every group's value rows.
TEST(QkClip, FactorsOfEachGroupsQueryAndKeyRows) {
  Layer l(gqa_config());
  const QkClip clip{.alpha = 0.3, .threshold = 10, .dtype = DType::kF32};
  EXPECT_TRUE(l.attn.qk_clip_scales({9.0f, 10.0f, 3.0f, 4.0f}, clip).empty());  // none above
  const std::vector<RowScale> s = l.attn.qk_clip_scales({12.0f, 40.0f, 3.0f, 9.5f}, clip);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].param, &l.attn.linear_qkv->weight());
  const float eta = clip.eta(40.0f);  // the group's max over its two heads
  const float q = clip.power(eta, 0.3), k = clip.power(eta, 0.7);
  ASSERT_EQ(s[0].factors.size(), 2u * 4u * 4u);
  for (int64_t r = 0; r < 32; ++r) {
    const int64_t g = r / 16, part = r % 16 / 4;  // 0, 1: queries; 2: key; 3: value
    const float want = g == 1 || part == 3 ? 1.0f : part == 2 ? k : q;
    EXPECT_EQ(s[0].factors[static_cast<size_t>(r)], want) << "row " << r;
  }
}

// After the clip the layer's scores of a clipped group are eta times what they were: queries
// times eta^alpha and keys times eta^(1 - alpha) (RoPE is linear; MLA's rotary queries take eta
// whole against the unchanged shared rotary key). Bound: f32 scores of O(10) recomputed from
// rescaled f32 weights, 1e-5 relative.
TEST(QkClip, ClippedGroupsScoresShrinkByEtaTheOthersStay) {
  for (const bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "multi-latent attention" : "GQA with RoPE");
    Layer l(mla ? mla_config() : gqa_config());
    const Tensor x = testing::random_tensor({kS, kB, 16}, 7);
    const std::vector<float> before = l.max_logits(x);
    const int64_t per = mla ? 1 : 2;  // heads per clipped unit (query group; MLA: head)
    // A threshold between the units' maxima: half of them clipped, half not.
    std::vector<float> units;
    for (int64_t u = 0; u < 4 / per; ++u)
      units.push_back(std::max(before[static_cast<size_t>(u * per)],
                               before[static_cast<size_t>(u * per + per - 1)]));
    std::sort(units.begin(), units.end());
    const double threshold = 0.5 * (units[units.size() / 2 - 1] + units[units.size() / 2]);
    const QkClip clip{.alpha = 0.4, .threshold = threshold, .dtype = DType::kF32};
    const std::vector<RowScale> s = l.attn.qk_clip_scales(before, clip);
    ASSERT_EQ(s.size(), mla ? 2u : 1u);
    scale_main_rows(*l.params, s);
    const std::vector<float> after = l.max_logits(x);
    int clipped = 0;
    for (int64_t u = 0; u < 4 / per; ++u) {
      float g = before[static_cast<size_t>(u * per)];
      for (int64_t p = 1; p < per; ++p) g = std::max(g, before[static_cast<size_t>(u * per + p)]);
      const double eta = g > threshold ? clip.eta(g) : 1.0;
      clipped += g > threshold;
      for (int64_t p = 0; p < per; ++p) {
        const auto h = static_cast<size_t>(u * per + p);
        EXPECT_NEAR(after[h], eta * before[h], 1e-5 * std::abs(before[h])) << "head " << h;
      }
      if (g > threshold) {  // the head that set the group's max now sits at the threshold
        float a = after[static_cast<size_t>(u * per)];
        for (int64_t p = 1; p < per; ++p) a = std::max(a, after[static_cast<size_t>(u * per + p)]);
        EXPECT_NEAR(a, threshold, 1e-5 * threshold);
      }
    }
    EXPECT_EQ(clipped, 2 / per);
  }
}

}  // namespace
}  // namespace megatron
