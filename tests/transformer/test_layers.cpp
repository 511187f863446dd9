// Every layer of src/transformer by finite differences, one at a time, in fp64: Norm (LayerNorm,
// RMSNorm), MLP (GELU with biases, SwiGLU without), SelfAttention (MHA with learned positions;
// GQA with RoPE, document masks and attention dropout; multi-latent attention), TransformerLayer
// and TransformerBlock (with the final norm, and with full recomputation), each without tensor
// parallelism (the parallel layouts are checked against these in tests/parallel and tests/e2e).
// The check and its tolerance: testing/layer_gradients.h.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "tensor/ops.h"
#include "testing/layer_gradients.h"
#include "testing/testing.h"
#include "transformer/attention.h"
#include "transformer/kv_cache.h"
#include "transformer/mlp.h"
#include "transformer/moe/moe_layer.h"
#include "transformer/norm.h"
#include "transformer/transformer_block.h"
#include "transformer/transformer_layer.h"

namespace megatron {
namespace {

constexpr int64_t kS = 6, kB = 2;

TransformerConfig base_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.seq_length = kS;
  c.vocab_size = 16;
  c.padded_vocab_size = 16;
  c.openai_gelu = false;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.init_method_std = 0.4;  // large enough that every path carries signal
  c.compute_dtype = DType::kF64;
  c.finalize();
  return c;
}

TransformerConfig llama_style(TransformerConfig c) {
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 12;
  c.normalization = Normalization::kRMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRope;
  c.finalize();
  return c;
}

using testing::LayerUnderTest;

void check_layer(LayerUnderTest layer, uint64_t seed) {
  testing::check_layer_gradients(
      std::move(layer), testing::random_tensor({kS, kB, 8}, seed + 1, 1.0, DType::kF64), seed);
}

struct SelfGroup {
  std::shared_ptr<ProcessGroup> group = make_self_process_group();
  TensorParallelContext tp() const { return TensorParallelContext{group.get(), false, {}}; }
};

TEST(LayerGradients, LayerNormAndRMSNorm) {
  // Plain, and zero-centred (--apply-layernorm-1p: scale 1 + weight).
  for (const bool centred : {false, true})
    for (Normalization kind : {Normalization::kLayerNorm, Normalization::kRMSNorm}) {
      SCOPED_TRACE(std::string(kind == Normalization::kLayerNorm ? "LayerNorm" : "RMSNorm") +
                   (centred ? " 1p" : ""));
      Norm norm("norm", 8, kind, 1e-5, centred);
      EXPECT_EQ(norm.weight.init, centred ? Init::kZeros : Init::kOnes);
      Norm::Ctx ctx;
      std::vector<Param*> ps;
      norm.collect(ps);
      check_layer({ps,
                   [&](const Tensor& x) {
                     ctx = {};
                     return norm.forward(x, ctx);
                   },
                   [&](const Tensor& dy) { return norm.backward(dy, ctx); }},
                  11);
    }
}

TEST(LayerGradients, MlpGeluWithBiasesAndSwigluWithout) {
  SelfGroup g;
  TransformerConfig relu2 = base_config();
  relu2.squared_relu = true;
  TransformerConfig quick = base_config();
  quick.quick_gelu = true;  // CLIP's vision MLP
  for (const TransformerConfig& cfg : {base_config(), llama_style(base_config()), relu2, quick}) {
    SCOPED_TRACE(cfg.swiglu         ? "SwiGLU"
                 : cfg.squared_relu ? "squared ReLU"
                 : cfg.quick_gelu   ? "quick GELU"
                                    : "GELU");
    MLP mlp("mlp", cfg, g.tp());
    MLP::Ctx ctx;
    std::vector<Param*> ps;
    mlp.collect(ps);
    check_layer({ps,
                 [&](const Tensor& x) {
                   ctx = {};
                   return mlp.forward(x, ctx);
                 },
                 [&](const Tensor& dy) { return mlp.backward(dy, ctx); }},
                12);
  }
}

// Documents [0, 2), [2, 6) in sequence 0 and [0, 6) in sequence 1 (--reset-attention-mask).
Tensor doc_starts() {
  Tensor t = Tensor::empty({kB, kS}, DType::kI32);
  const int32_t starts[] = {0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0};
  std::copy(starts, starts + kB * kS, t.data<int32_t>());
  return t;
}

// SelfAttention's parameter and input gradients by finite differences (doc_start: document
// masks, or undefined).
void check_attention(SelfAttention& attn, const Tensor& doc_start, const ForwardMode& mode,
                     uint64_t seed) {
  SelfAttention::Ctx ctx;
  TokenLayout layout;
  layout.doc_start = doc_start;
  std::vector<Param*> ps;
  attn.collect(ps);
  check_layer({ps,
               [&](const Tensor& x) {
                 ctx = {};
                 return attn.forward(x, layout, ctx, mode);
               },
               [&](const Tensor& dy) { return attn.backward(dy, ctx); }},
              seed);
}

TEST(LayerGradients, SelfAttentionMhaAndGqaWithRopeDocumentsAndDropout) {
  SelfGroup g;
  TransformerConfig gqa = llama_style(base_config());
  gqa.attention_dropout = 0.2;
  const ForwardMode training{true, 77, 5};
  for (const TransformerConfig& cfg : {base_config(), gqa}) {
    SCOPED_TRACE(cfg.num_query_groups > 0 && cfg.num_query_groups < cfg.num_attention_heads
                     ? "GQA + RoPE + documents + dropout"
                     : "MHA");
    SelfAttention attn("attn", cfg, 0, g.tp());
    check_attention(attn, cfg.swiglu ? doc_starts() : Tensor(), training, 13);
  }
}

// The RoPE variants (interleaved pairs, Llama 3.1 scaling, position interpolation, a partial
// rotary dimension, head dim != hidden / heads), --qk-layernorm with both norms, --qk-l2-norm
// and a --no-rope-freq layer.
TEST(LayerGradients, SelfAttentionVariants) {
  SelfGroup g;
  // A deque: GCC 12's -Warray-bounds misreads a vector's reallocating moves of these pairs.
  std::deque<std::pair<std::string, TransformerConfig>> cases;
  {
    TransformerConfig c = llama_style(base_config());
    c.rotary_interleaved = true;
    c.rope_scaling_factor = 8;
    c.rotary_base = 500000;
    c.rotary_seq_len_interpolation_factor = 0.01;  // positions x 100: every frequency band turns
    c.finalize();
    cases.emplace_back("interleaved, Llama 3.1 scaling, interpolation", c);
  }
  {
    TransformerConfig c = llama_style(base_config());
    c.kv_channels = 4;
    c.rotary_percent = 0.5;
    c.qk_layernorm = true;
    c.finalize();
    cases.emplace_back("qk RMSNorm, kv-channels 4, rotary 50%", c);
  }
  {
    TransformerConfig c = base_config();
    c.qk_layernorm = true;
    c.layernorm_zero_centered_gamma = true;
    c.finalize();
    cases.emplace_back("qk LayerNorm 1p", c);
  }
  {
    TransformerConfig c = llama_style(base_config());
    c.qk_l2_norm = true;  // Megatron's L2Norm: no weight
    c.finalize();
    cases.emplace_back("qk L2 norm (Llama 4)", c);
  }
  {
    TransformerConfig c = llama_style(base_config());
    c.qk_l2_norm = true;
    c.no_rope_layers = {1};  // --no-rope-freq: layer 0 skips RoPE
    c.finalize();
    cases.emplace_back("qk L2 norm, NoPE layer", c);
  }
  {
    TransformerConfig c = llama_style(base_config());
    c.attention_output_gate = true;  // Megatron core 0.19's gated attention, with GQA
    c.qk_layernorm = true;
    c.finalize();
    cases.emplace_back("output gate, GQA, qk RMSNorm", c);
  }
  {
    TransformerConfig c = base_config();
    c.attention_output_gate = true;
    c.softmax_type = SoftmaxType::kLearnable;  // the gate after the sinks
    c.finalize();
    cases.emplace_back("output gate, MHA, learnable sinks, biases", c);
  }
  for (const auto& [name, cfg] : cases) {
    SCOPED_TRACE(name);
    SelfAttention attn("attn", cfg, 0, g.tp());
    EXPECT_EQ(attn.q_layernorm.has_value(), cfg.qk_layernorm || cfg.qk_l2_norm);
    std::vector<Param*> params;
    attn.collect(params);
    const bool norm_params = std::any_of(params.begin(), params.end(), [](const Param* p) {
      return p->name.find("layernorm") != std::string::npos;
    });
    EXPECT_EQ(norm_params, cfg.qk_layernorm && !cfg.qk_l2_norm);  // L2Norm has no weight
    check_attention(attn, Tensor(), ForwardMode{}, 14);
  }
}

// --attention-output-gate's layout (Megatron core 0.19's linear_qkv rows per query group: its
// queries, their gates, the key, the value): with the plain layer's rows placed so and zero gate
// rows, every gate is sigmoid(0) = 1/2 and the gated layer's output is exactly half the plain
// one's (linear_proj without bias is linear); gate rows anywhere else, or the key and value
// taken from the wrong rows, would give another output.
TEST(AttentionOutputGate, ZeroGatesHalveThePlainLayer) {
  SelfGroup g;
  TransformerConfig plain_cfg = llama_style(base_config());  // GQA: 2 queries per group
  TransformerConfig gated_cfg = plain_cfg;
  gated_cfg.attention_output_gate = true;
  gated_cfg.finalize();
  SelfAttention plain("attn", plain_cfg, 0, g.tp()), gated("attn", gated_cfg, 0, g.tp());
  std::vector<Param*> pp, gp;
  plain.collect(pp);
  gated.collect(gp);
  ParamSet plain_params(pp, DType::kF64), gated_params(gp, DType::kF64);
  plain_params.initialize(3);
  gated_params.initialize(3);
  const int64_t h = plain_cfg.hidden_size, hn = plain_cfg.head_dim();
  const int64_t ng = plain_cfg.num_query_groups, qpg = plain_cfg.queries_per_group();
  const Tensor& w0 = plain.linear_qkv->weight().main;
  Tensor& w1 = gated.linear_qkv->weight().main;
  for (int64_t grp = 0; grp < ng; ++grp) {
    const int64_t src = grp * (qpg + 2) * hn, dst = grp * (2 * qpg + 2) * hn;
    for (int64_t r = 0; r < (2 * qpg + 2) * hn; ++r) {
      const int64_t local = r < qpg * hn ? r : r < 2 * qpg * hn ? -1 : r - qpg * hn;
      for (int64_t j = 0; j < h; ++j)
        w1.data<double>()[(dst + r) * h + j] =
            local < 0 ? 0.0 : w0.data<double>()[(src + local) * h + j];
    }
  }
  gated.linear_proj.weight().main.copy_from(plain.linear_proj.weight().main);
  plain_params.sync_compute_from_main();
  gated_params.sync_compute_from_main();
  const Tensor x = testing::random_tensor({kS, kB, h}, 21, 1.0, DType::kF64);
  SelfAttention::Ctx c0, c1;
  const Tensor y0 = plain.forward(x, TokenLayout{}, c0, ForwardMode{});
  const Tensor y1 = gated.forward(x, TokenLayout{}, c1, ForwardMode{});
  // Within 1e-12: the wider linear_qkv is another GEMM shape, which may sum in another order (f64).
  for (int64_t i = 0; i < y0.numel(); ++i)
    ASSERT_NEAR(y1.item(i), 0.5 * y0.item(i), 1e-12 * (1 + std::abs(y0.item(i)))) << i;
  // Megatron: "Output gate is not supported for MLA yet".
  TransformerConfig mla = gated_cfg;
  mla.mla.enabled = true;
  try {
    mla.finalize();
    ADD_FAILURE() << "gated multi-latent attention was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Output gate is not supported for MLA"), std::string::npos)
        << e.what();
  }
}

// Generation with a KV cache runs the gate too: a prefill of 4 positions, then one position at a
// time, gives the rows of one forward over the whole sequence (1e-12: the same f64 math in other
// GEMM and attention shapes).
TEST(AttentionOutputGate, CachedGenerationEqualsOneForward) {
  SelfGroup g;
  TransformerConfig c = llama_style(base_config());
  c.attention_output_gate = true;
  c.finalize();
  SelfAttention attn("attn", c, 0, g.tp());
  std::vector<Param*> ps;
  attn.collect(ps);
  ParamSet params(ps, DType::kF64);
  params.initialize(5);
  params.sync_compute_from_main();
  const int64_t h = c.hidden_size;
  const Tensor x = testing::random_tensor({kS, kB, h}, 22, 1.0, DType::kF64);
  SelfAttention::Ctx ctx;
  const Tensor whole = attn.forward(x, TokenLayout{}, ctx, ForwardMode{});
  KvCache cache(kS);
  ForwardMode mode;
  mode.kv_cache = &cache;
  for (int64_t begin = 0; begin < kS;) {
    const int64_t n = begin == 0 ? 4 : 1;
    SelfAttention::Ctx step;
    const Tensor part = attn.forward(x.slice0(begin, begin + n).clone(), TokenLayout{}, step, mode);
    cache.advance(n);
    for (int64_t i = 0; i < part.numel(); ++i) {
      const double want = whole.item(begin * kB * h + i);
      ASSERT_NEAR(part.item(i), want, 1e-12 * (1 + std::abs(want))) << begin << " " << i;
    }
    begin += n;
  }
}

// Multi-latent attention: with the query bottleneck and YaRN (both mscales in play), attention
// dropout and document masks; without the bottleneck, with plain RoPE over part of the rotary
// channels and value heads wider than the query heads (q and k zero-padded); and with the latent
// norms LayerNorm-1p. Every weight (down and up projections, latent norms, linear_proj) and the
// input by finite differences through the packed buffer, RoPE and the padding.
TEST(LayerGradients, MultiLatentAttention) {
  SelfGroup g;
  std::vector<std::pair<std::string, TransformerConfig>> cases;
  const auto mla = [](TransformerConfig c) {
    c.kv_channels = 0;
    c.mla.enabled = true;
    c.mla.kv_lora_rank = 6;
    c.mla.qk_head_dim = 4;
    c.mla.qk_pos_emb_head_dim = 4;
    c.mla.v_head_dim = 3;
    c.qk_layernorm = true;
    c.num_query_groups = 0;
    return c;
  };
  {
    TransformerConfig c = mla(llama_style(base_config()));
    c.mla.q_lora_rank = 5;
    c.mla.rotary_scaling_factor = 40;
    c.mla.mscale = 1.0;
    c.mla.mscale_all_dim = 0.8;
    c.mla.original_max_position_embeddings = 16;  // a correction range inside the 2 pairs
    c.attention_dropout = 0.2;
    c.finalize();
    cases.emplace_back("query bottleneck, YaRN, dropout, documents", c);
  }
  {
    TransformerConfig c = mla(llama_style(base_config()));
    c.mla.yarn = false;
    c.rotary_percent = 0.5;
    c.mla.v_head_dim = 11;  // wider than 4 + 4
    c.finalize();
    cases.emplace_back("full-rank queries, RoPE over half, wide values", c);
  }
  {
    TransformerConfig c = mla(base_config());
    c.layernorm_zero_centered_gamma = true;
    c.finalize();
    cases.emplace_back("LayerNorm-1p latents, learned positions", c);
  }
  const ForwardMode training{true, 77, 5};
  for (const auto& [name, cfg] : cases) {
    SCOPED_TRACE(name);
    SelfAttention attn("attn", cfg, 0, g.tp());
    ASSERT_TRUE(attn.mla.has_value());
    EXPECT_FALSE(attn.linear_qkv.has_value());
    check_attention(attn, cfg.attention_dropout > 0 ? doc_starts() : Tensor(), training, 15);
  }
}

TEST(LayerGradients, TransformerLayerWithHiddenDropout) {
  SelfGroup g;
  for (TransformerConfig cfg : {base_config(), llama_style(base_config())}) {
    SCOPED_TRACE(cfg.swiglu ? "Llama style" : "GPT-2 style");
    cfg.hidden_dropout = 0.1;
    cfg.attention_dropout = 0.1;
    TransformerLayer layer("layer", cfg, 1, g.tp());
    TransformerLayer::Ctx ctx;
    std::vector<Param*> ps;
    layer.collect(ps);
    const ForwardMode training{true, 5, 9};
    check_layer({ps,
                 [&](const Tensor& x) {
                   ctx = {};
                   return layer.forward(x, TokenLayout{}, ctx, training);
                 },
                 [&](const Tensor& dy) { return layer.backward(dy, ctx); }},
                14);
  }
}

// The MoE layer (router, dispatch, experts, combine) by finite differences: the routing is
// piecewise constant in the selection, so with distinct router scores the layer is smooth at the
// test point and its gradient (through the probabilities into the router, and into each expert)
// is checked like any layer's. Variants: softmax after the top-k with shared experts; sigmoid with
// the scaling factor and jittered input; pre-softmax top-1 with a capacity that drops tokens. The
// load-balancing losses are off here (their gradient is not part of the layer's output; the
// routing and Mixtral oracles check it).
TEST(LayerGradients, MoeLayerRoutingExpertsAndSharedExperts) {
  SelfGroup g;
  TransformerConfig base = llama_style(base_config());
  base.moe.num_experts = 4;
  base.moe.ffn_hidden_size = 6;
  base.moe.aux_loss_coeff = {0.0};
  auto variant = [&](const std::function<void(MoeConfig&)>& f) {
    TransformerConfig c = base;
    f(c.moe);
    c.finalize();
    return c;
  };
  const std::vector<std::pair<std::string, TransformerConfig>> cfgs = {
      {"softmax top-2 + shared experts",
       variant([](MoeConfig& m) { m.shared_expert_intermediate_size = 8; })},
      {"pre-softmax top-2 + gated shared experts (Qwen2-MoE)", variant([](MoeConfig& m) {
         m.pre_softmax = true;
         m.shared_expert_intermediate_size = 8;
         m.shared_expert_gate = true;
       })},
      {"sigmoid top-2, scaling 2.5, input jitter", variant([](MoeConfig& m) {
         m.score_function = MoeScoreFunction::kSigmoid;
         m.topk_scaling_factor = 2.5;
         m.input_jitter_eps = 0.05;
       })},
      {"pre-softmax top-1, capacity 1 (drops)", variant([](MoeConfig& m) {
         m.pre_softmax = true;
         m.router_topk = 1;
         m.capacity_factor = 1.0;
       })},
      {"sigmoid top-1, probabilities on the input (Llama 4)", variant([](MoeConfig& m) {
         m.score_function = MoeScoreFunction::kSigmoid;
         m.router_topk = 1;
         m.apply_probs_on_input = true;
       })},
      {"LatentMoE: experts at width 3, shared experts at h", variant([](MoeConfig& m) {
         m.latent_size = 3;
         m.shared_expert_intermediate_size = 8;
       })},
      {"LatentMoE, alltoall dispatcher, sigmoid top-2", variant([](MoeConfig& m) {
         m.latent_size = 5;
         m.dispatcher = MoeDispatcher::kAllToAll;
         m.score_function = MoeScoreFunction::kSigmoid;
       })},
      {"LatentMoE with biases (projections, experts, router)", [&] {
         TransformerConfig c = base;
         c.add_bias_linear = true;
         c.moe.latent_size = 4;
         c.finalize();
         return c;
       }()}};
  const ForwardMode training{true, 3, 4};
  for (const auto& [name, cfg] : cfgs) {
    SCOPED_TRACE(name);
    MoELayer moe("mlp", cfg, 0, g.tp());
    MoELayer::Ctx ctx;
    std::vector<Param*> ps;
    moe.collect(ps);
    if (cfg.moe.shared_expert_gate) {  // Megatron's gate_weight [1, h], and it is trained
      const auto it = std::find_if(ps.begin(), ps.end(), [](const Param* p) {
        return p->name == "mlp.shared_experts.gate_weight";
      });
      ASSERT_NE(it, ps.end());
      EXPECT_EQ((*it)->shape, (Shape{1, cfg.hidden_size}));
    }
    if (cfg.moe.latent_size > 0) {
      // Megatron's names and shapes: the projections [L, h] and [h, L], the experts at L.
      const int64_t L = cfg.moe.latent_size, h = cfg.hidden_size;
      std::map<std::string, Shape> shapes;
      for (const Param* p : ps) shapes[p->name] = p->shape;
      EXPECT_EQ(shapes.at("mlp.fc1_latent_proj.weight"), (Shape{L, h}));
      EXPECT_EQ(shapes.at("mlp.fc2_latent_proj.weight"), (Shape{h, L}));
      const int64_t f1 = cfg.gated_mlp() ? 2 * cfg.moe.ffn_hidden_size : cfg.moe.ffn_hidden_size;
      EXPECT_EQ(shapes.at("mlp.experts.local_experts.0.linear_fc1.weight"), (Shape{f1, L}));
      EXPECT_EQ(shapes.at("mlp.experts.local_experts.0.linear_fc2.weight"),
                (Shape{L, cfg.moe.ffn_hidden_size}));
      if (cfg.add_bias_linear) {
        EXPECT_EQ(shapes.at("mlp.fc1_latent_proj.bias"), (Shape{L}));
        EXPECT_EQ(shapes.at("mlp.fc2_latent_proj.bias"), (Shape{h}));
      }
    }
    bool dropped = false;
    check_layer({ps,
                 [&](const Tensor& x) {
                   ctx = {};
                   Tensor y = moe.forward(x, ctx, training);
                   const auto& r = ctx.router.routing;
                   int64_t routed = 0;
                   for (uint8_t v : r.map) routed += v;
                   dropped = routed < r.tokens * cfg.moe.router_topk;
                   return y;
                 },
                 [&](const Tensor& dy) { return moe.backward(dy, ctx); }},
                15);
    EXPECT_EQ(dropped, cfg.moe.capacity_factor > 0) << "the capacity case must drop tokens";
  }
}

// --moe-apply-probs-on-input: y = expert(p x) instead of p expert(x). With squared ReLU (degree 2,
// no biases) expert(p x) = p^2 expert(x) for p > 0, so the flag's output is the default's times
// each token's probability (sigmoid top-1 scores, in (0, 1)).
TEST(MoeOptions, ProbabilitiesOnTheInput) {
  SelfGroup g;
  struct Out {
    Tensor y;
    std::vector<double> probs;
  };
  auto run = [&](bool on_input) {
    TransformerConfig c = llama_style(base_config());
    c.swiglu = false;
    c.squared_relu = true;
    c.moe.num_experts = 4;
    c.moe.ffn_hidden_size = 6;
    c.moe.aux_loss_coeff = {0.0};
    c.moe.router_topk = 1;
    c.moe.score_function = MoeScoreFunction::kSigmoid;
    c.moe.apply_probs_on_input = on_input;
    c.finalize();
    MoELayer moe("mlp", c, 0, g.tp());
    std::vector<Param*> ps;
    moe.collect(ps);
    ParamSet params(ps, DType::kF64);
    params.initialize(3);
    params.sync_compute_from_main();
    MoELayer::Ctx ctx;
    const Tensor x = testing::random_tensor({5, 2, c.hidden_size}, 9, 1.0, DType::kF64);
    Out o{moe.forward(x, ctx, ForwardMode{}).clone(), {}};
    const auto& r = ctx.router.routing;
    for (int64_t t = 0; t < r.tokens; ++t) {
      double p = 0;
      for (int64_t e = 0; e < r.experts; ++e) p += r.probs[static_cast<size_t>(t * r.experts + e)];
      o.probs.push_back(p);
    }
    return o;
  };
  const Out on = run(true), off = run(false);
  ASSERT_EQ(on.probs, off.probs);
  const int64_t h = on.y.dim(2);
  Tensor want = off.y.clone();
  for (int64_t t = 0; t < static_cast<int64_t>(on.probs.size()); ++t) {
    EXPECT_GT(on.probs[static_cast<size_t>(t)], 0.0);
    EXPECT_LT(on.probs[static_cast<size_t>(t)], 1.0);
    for (int64_t c = 0; c < h; ++c)
      want.data<double>()[t * h + c] *= on.probs[static_cast<size_t>(t)];
  }
  EXPECT_TRUE(testing::allclose(on.y, want, 1e-12, 1e-10));  // fp64: rounding only
  EXPECT_FALSE(testing::allclose(on.y, off.y, 1e-6, 1e-6));
}

// --moe-router-force-load-balancing (benchmarks): routed on N(0, 1) logits, a router that sends
// every token to expert 0 spreads them over all experts; the same draws again in a second
// forward (a recomputation); the gating GEMM still gets the logits' gradient (straight through).
TEST(MoeOptions, ForcedLoadBalancingSpreadsTokensAndPassesGradients) {
  SelfGroup g;
  TransformerConfig c = llama_style(base_config());
  c.moe.num_experts = 4;
  c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coeff = {0.0};
  c.finalize();
  auto counts_of = [&](MoELayer::Ctx& ctx, MoELayer& moe, const Tensor& x) {
    ctx = {};
    moe.forward(x, ctx, ForwardMode{true, 3, 4});
    std::vector<int64_t> n(4, 0);
    const auto& r = ctx.router.routing;
    for (int64_t t = 0; t < r.tokens; ++t)
      for (int64_t e = 0; e < 4; ++e) n[static_cast<size_t>(e)] += r.map[t * 4 + e];
    return n;
  };
  for (bool forced : {false, true}) {
    SCOPED_TRACE(forced ? "forced" : "learned");
    c.moe.force_load_balancing = forced;
    MoELayer moe("mlp", c, 0, g.tp());
    std::vector<Param*> ps;
    moe.collect(ps);
    ParamSet params(ps, DType::kF64);
    params.initialize(3);
    // The router prefers expert 0 for every token (a positive input, a large row 0).
    Tensor& w = moe.router.weight.main;
    for (int64_t i = 0; i < w.numel(); ++i) w.data<double>()[i] = i < c.hidden_size ? 10.0 : 0.0;
    params.sync_compute_from_main();
    Tensor x = testing::random_tensor({16, 2, c.hidden_size}, 5, 0.5, DType::kF64);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<double>()[i] = std::fabs(x.data<double>()[i]) + 0.1;
    MoELayer::Ctx ctx;
    const std::vector<int64_t> n = counts_of(ctx, moe, x);
    if (!forced) {
      EXPECT_EQ(n[0], 32);  // every one of the 32 tokens (top-2: its second choice varies)
      continue;
    }
    // 64 selections over 4 experts: each gets a share near 16 (binomial sd ~3.5).
    for (int64_t e = 0; e < 4; ++e) EXPECT_GT(n[static_cast<size_t>(e)], 6) << "expert " << e;
    const std::vector<double> logits = ctx.router.logits;
    MoELayer::Ctx again;
    EXPECT_EQ(counts_of(again, moe, x), n);
    EXPECT_EQ(again.router.logits, logits);
    params.zero_grads();
    moe.backward(testing::random_tensor(x.shape(), 6, 1.0, DType::kF64), ctx);
    double gw = 0;
    for (int64_t i = 0; i < moe.router.weight.main_grad.numel(); ++i)
      gw += std::fabs(moe.router.weight.main_grad.item(i));
    EXPECT_GT(gw, 0) << "the straight-through gradient reaches the gating GEMM";
    // Outside training (evaluation, generation) every forward draws other logits.
    MoELayer::Ctx e1, e2;
    moe.forward(x, e1, ForwardMode{});
    moe.forward(x, e2, ForwardMode{});
    EXPECT_NE(e1.router.logits, e2.router.logits);
  }
}

// --moe-router-padding-for-fp8: the rows it adds carry probability 0, so outside FP8 the layer's
// output and gradients are the unpadded layer's (f64: to rounding), while each expert's rows grow
// to a multiple of 16 (or to every token, when too few are left to reach one). Also with
// capacity dropping (a dropped assignment may come back as padding, still with probability 0 and
// no gradient to the router) and with the probabilities on the experts' input.
TEST(MoeOptions, PaddingForFp8AddsRowsThatChangeNothing) {
  SelfGroup g;
  struct Out {
    Tensor y, dx;
    std::vector<Tensor> grads;
    std::vector<int64_t> counts;
  };
  const int64_t tokens = 20;
  const std::vector<std::pair<std::string, std::function<void(MoeConfig&)>>> variants = {
      {"dropless top-2", [](MoeConfig&) {}},
      {"capacity 0.5", [](MoeConfig& m) { m.capacity_factor = 0.5; }},
      {"probabilities on the input", [](MoeConfig& m) {
         m.score_function = MoeScoreFunction::kSigmoid;
         m.router_topk = 1;
         m.apply_probs_on_input = true;
       }}};
  for (const auto& [name, variant] : variants) {
    SCOPED_TRACE(name);
    auto run = [&](bool pad) {
      TransformerConfig c = llama_style(base_config());
      c.moe.num_experts = 4;
      c.moe.ffn_hidden_size = 6;
      c.moe.aux_loss_coeff = {0.0};
      c.moe.dispatcher = MoeDispatcher::kAllToAll;
      variant(c.moe);
      c.finalize();
      c.moe.router_padding_for_fp8 = pad;  // after finalize: the trainer also demands FP8
      MoELayer moe("mlp", c, 0, g.tp());
      std::vector<Param*> ps;
      moe.collect(ps);
      ParamSet params(ps, DType::kF64);
      params.initialize(3);
      params.sync_compute_from_main();
      params.zero_grads();
      MoELayer::Ctx ctx;
      const Tensor x = testing::random_tensor({tokens / 2, 2, c.hidden_size}, 9, 1.0, DType::kF64);
      Out o;
      o.y = moe.forward(x, ctx, ForwardMode{true, 3, 4}).clone();
      o.counts = ctx.plan.counts();
      o.dx = moe.backward(testing::random_tensor(x.shape(), 6, 1.0, DType::kF64), ctx).clone();
      for (Param* p : ps) o.grads.push_back(p->main_grad.clone());
      return o;
    };
    const Out plain = run(false), padded = run(true);
    int64_t routed = 0, rows = 0;
    for (size_t e = 0; e < plain.counts.size(); ++e) {
      routed += plain.counts[e];
      rows += padded.counts[e];
      EXPECT_GE(padded.counts[e], plain.counts[e]);
      EXPECT_TRUE(padded.counts[e] % 16 == 0 || padded.counts[e] == tokens)
          << "expert " << e << ": " << padded.counts[e] << " rows";
    }
    EXPECT_GT(rows, routed) << "nothing was padded";
    // f64 sums of the same terms plus exact zeros: equal to rounding.
    EXPECT_TRUE(testing::allclose(padded.y, plain.y, 1e-12, 1e-12));
    EXPECT_TRUE(testing::allclose(padded.dx, plain.dx, 1e-12, 1e-12));
    for (size_t i = 0; i < plain.grads.size(); ++i)
      EXPECT_TRUE(testing::allclose(padded.grads[i], plain.grads[i], 1e-12, 1e-12))
          << "param " << i;
  }
}

TEST(LayerGradients, TransformerBlockWithFinalNormPlainAndRecomputed) {
  SelfGroup g;
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "full recomputation, uniform 1" : "no recomputation");
    TransformerConfig cfg = llama_style(base_config());
    cfg.hidden_dropout = 0.1;
    if (recompute) {
      cfg.recompute_granularity = RecomputeGranularity::kFull;
      cfg.recompute_method = RecomputeMethod::kUniform;
      cfg.recompute_num_layers = 1;
    }
    TransformerBlock block("decoder", cfg, g.tp(), 0, cfg.num_layers, true);
    TransformerBlock::Ctx ctx;
    std::vector<Param*> ps;
    block.collect(ps);
    const ForwardMode training{true, 21, 2};
    check_layer({ps,
                 [&](const Tensor& x) {
                   ctx = {};
                   return block.forward(x, TokenLayout{}, ctx, training);
                 },
                 [&](const Tensor& dy) { return block.backward(dy, ctx); }},
                15);
  }
}

}  // namespace
}  // namespace megatron
