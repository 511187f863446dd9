// The PyTorch oracle: a tiny GPT-2-style and a tiny Llama-style model with random weights, written
// by tests/reference/hf_oracle.py as Hugging Face safetensors together with PyTorch's logits,
// loss, every parameter gradient and the losses of 10 AdamW and 10 SGD steps. We load the same
// directory through our HF importer and must reproduce all of it.
//
// Usage: test_hf_oracle ORACLE_DIR (CTest runs the Python script first, as a fixture).
//
// Tolerances (both sides compute in f32 with different summation orders and kernels):
// - logits: |err| <= 1e-5 + 1e-4 |x|. Logits are O(1) sums over h = 64 products; f32 rounding
//   differences are ~1e-6.
// - loss: 1e-5 relative.
// - gradients: |err| <= a + 1e-3 |g|, a = max(1e-6, 1e-5 max |g| of the tensor): with the largest
//   gradients O(0.1) a is 1e-6; gpt-oss's oracle scales its weights up (to reach the clamps and
//   separate the routing) and its gradients are O(1), where elements that are small by
//   cancellation carry the f32 rounding of the large terms (1e-6 of them, measured 1.6e-6 at
//   1.8). A wrong term shows up as O(|g|) error, three orders above this bound.
// - AdamW losses over 10 steps: 1e-4 relative. Adam normalises updates, so tiny gradient
//   differences can flip the sign of near-zero updates; the loss still agrees to ~1e-5.
// - SGD (with momentum) losses over 10 steps: the same 1e-4 relative bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "checkpoint/safetensors.h"
#include "models/gpt/gpt_hf.h"
#include "models/gpt/gpt_oss_hf.h"
#include "optim/adamw.h"
#include "oracle_mtp.h"
#include "parallel/row_scale.h"
#include "tensor/ops.h"
#include "testing/testing.h"
#include "transformer/moe/aux_tracker.h"
#include "transformer/qk_clip.h"

namespace megatron {
namespace {

std::string g_oracle_dir;

struct Loaded {
  HfModelInfo info;
  std::unique_ptr<GPTModel> model;
  std::unique_ptr<ParamSet> params;
};

// variant: a change of the config before the model is built (a variant that computes the same
// function from the same Hugging Face weights, e.g. --apply-layernorm-1p, which stores gamma - 1).
Loaded load(const std::string& dir, const std::function<void(TransformerConfig&)>& variant = {}) {
  Loaded l;
  l.info = read_hf_config(dir);
  if (variant) variant(l.info.config);
  TransformerConfig c = l.info.config;
  c.padded_vocab_size = pad_vocab_size(c.vocab_size, 128);
  c.seq_length = 16;
  c.finalize();
  l.model = std::make_unique<GPTModel>(c);
  l.params = std::make_unique<ParamSet>(l.model->parameters(), DType::kF32);
  load_hf_weights(dir, l.info, *l.model, *l.params);
  return l;
}

double mean_loss(const Tensor& per_token) {
  double s = 0;
  for (int64_t i = 0; i < per_token.numel(); ++i) s += per_token.item(i);
  return s / static_cast<double>(per_token.numel());
}

struct Batch {
  Tensor inputs, labels;  // [B, S] each
};

// The oracle's tokens [B, S + 1] as inputs (the first S) and labels (the last S).
Batch oracle_batch(safetensors::File& expected) {
  Tensor tokens = expected.read("tokens");
  const int64_t B = tokens.dim(0), S = tokens.dim(1) - 1;
  Batch out{Tensor::empty({B, S}, DType::kI64), Tensor::empty({B, S}, DType::kI64)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      out.inputs.data<int64_t>()[b * S + t] = tokens.data<int64_t>()[b * (S + 1) + t];
      out.labels.data<int64_t>()[b * S + t] = tokens.data<int64_t>()[b * (S + 1) + t + 1];
    }
  return out;
}

// Our logits are [S * B, Vp] (row t * B + b); PyTorch's are [B, S, V].
Tensor logits_as_pytorch(const GPTModel::Ctx& ctx, const TransformerConfig& c, int64_t B,
                         int64_t S) {
  Tensor got = Tensor::empty({B, S, c.vocab_size});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t)
      for (int64_t v = 0; v < c.vocab_size; ++v)
        got.data<float>()[(b * S + t) * c.vocab_size + v] =
            ctx.head.logits.data<float>()[(t * B + b) * c.padded_vocab_size + v];
  return got;
}

// The gradient tolerance above.
::testing::AssertionResult gradient_close(const Tensor& got, const Tensor& want) {
  double largest = 0;
  for (int64_t i = 0; i < want.numel(); ++i) largest = std::max(largest, std::abs(want.item(i)));
  return testing::allclose(got, want, std::max(1e-6, 1e-5 * largest), 1e-3);
}

using testing::oracle_mode;
using testing::set_mtp_gradients;

void run_oracle(const std::string& arch,
                const std::function<void(TransformerConfig&)>& variant = {}) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass the oracle directory as the first argument";
  const std::string root = g_oracle_dir + "/" + arch;
  auto expected = safetensors::File::open(root + "/expected.safetensors");
  Loaded l = load(root + "/model", variant);
  const TransformerConfig& c = l.model->config();
  const Batch batch = oracle_batch(expected);
  const int64_t B = batch.inputs.dim(0), S = batch.inputs.dim(1);
  GPTModel::Ctx ctx;
  Tensor loss = l.model->forward(batch.inputs, batch.labels, Tensor(), ctx, oracle_mode(c));
  EXPECT_EQ(static_cast<int64_t>(ctx.mtp_losses.size()), c.mtp_num_layers);
  EXPECT_TRUE(
      testing::allclose(logits_as_pytorch(ctx, c, B, S), expected.read("logits"), 1e-5, 1e-4))
      << "logits";
  const double want_loss = expected.read("loss").item(0);
  EXPECT_NEAR(mean_loss(loss), want_loss, 1e-5 * want_loss) << "loss";

  l.params->zero_grads();
  set_mtp_gradients(c, B, S, ctx);
  l.model->backward(Tensor::full({B, S}, 1.0 / static_cast<double>(B * S)), ctx);
  auto grads = to_hf_tensors(l.info, *l.model, true);
  for (const auto& [name, g] : grads) {
    Tensor want = expected.read("grad." + name);
    EXPECT_TRUE(gradient_close(g, want)) << "gradient of " << name;
  }
  const double norm = grad_norm(*l.params);
  EXPECT_NEAR(norm, expected.read("grad_norm").item(0), 1e-4 * norm) << "grad norm";

  // 10 AdamW steps on the same batch: lr 1e-3, betas (0.9, 0.95), wd 0.1 on matrices, clip 1.0.
  Loaded fresh = load(root + "/model", variant);
  AdamW opt(*fresh.params, AdamWConfig{0.9, 0.95, 1e-8, 0.1});
  Tensor want_losses = expected.read("adam_losses");
  // A curve that is chaotic at the f32 level after some steps (gpt-oss's: hf_oracle.py measures
  // it) is compared over the steps before.
  const int64_t adam_steps =
      expected.contains("adam_steps_compared")
          ? static_cast<int64_t>(expected.read("adam_steps_compared").item(0))
          : want_losses.numel();
  for (int64_t step = 0; step < adam_steps; ++step) {
    GPTModel::Ctx sctx;
    Tensor l2 = fresh.model->forward(batch.inputs, batch.labels, Tensor(), sctx, oracle_mode(c));
    const double got_loss = mean_loss(l2);
    EXPECT_NEAR(got_loss, want_losses.item(step), 1e-4 * want_losses.item(step)) << "step " << step;
    fresh.params->zero_grads();
    set_mtp_gradients(c, B, S, sctx);
    fresh.model->backward(Tensor::full({B, S}, 1.0 / static_cast<double>(B * S)), sctx);
    clip_grads(*fresh.params, 1.0, grad_norm(*fresh.params));
    opt.step(1e-3);
  }

  // 10 steps of --optimizer sgd from the initial weights: torch.optim.SGD with lr 0.05, momentum
  // 0.9, wd 0.1 on matrices (L2), clip 1.0. The same tolerance as Adam's (each step's update is
  // lr x the clipped gradient, so the losses follow the gradients' 1e-3 agreement more closely).
  Loaded again = load(root + "/model", variant);
  AdamWConfig sgd_cfg{0.9, 0.95, 1e-8, 0.1};
  sgd_cfg.rule = UpdateRule::kSgd;
  sgd_cfg.sgd_momentum = 0.9;
  AdamW sgd(*again.params, sgd_cfg);
  Tensor want_sgd = expected.read("sgd_losses");
  for (int64_t step = 0; step < want_sgd.numel(); ++step) {
    GPTModel::Ctx sctx;
    Tensor l2 = again.model->forward(batch.inputs, batch.labels, Tensor(), sctx, oracle_mode(c));
    EXPECT_NEAR(mean_loss(l2), want_sgd.item(step), 1e-4 * want_sgd.item(step))
        << "sgd step " << step;
    again.params->zero_grads();
    set_mtp_gradients(c, B, S, sctx);
    again.model->backward(Tensor::full({B, S}, 1.0 / static_cast<double>(B * S)), sctx);
    clip_grads(*again.params, 1.0, grad_norm(*again.params));
    sgd.step(0.05);
  }
  EXPECT_LT(want_sgd.item(want_sgd.numel() - 1), want_sgd.item(0) - 0.01);  // SGD moved the loss
}

// MuonClip's qk-clip after each of 5 AdamW steps (hf_oracle.py's qk_clip_oracle): the model with
// its query and key projections 8x larger (scores of O(5)) and a threshold between its groups'
// largest scores, which PyTorch keeps at least 1e-3 (relative) away from every group's at every
// step. Each step: every layer's per-head largest score (SelfAttention::max_logits, what the clip
// reads) within 1e-4 relative of PyTorch's (f32 scores of O(5) from weights that agree as the
// AdamW losses do; clipping moves them by 1e-2 to 0.3, so a wrong factor, row or group shows),
// the same number of groups clipped, and the loss within the AdamW bound above (1e-4).
void run_qk_clip_oracle(const std::string& arch) {
  SCOPED_TRACE("qk-clip");
  const std::string root = g_oracle_dir + "/" + arch;
  auto expected = safetensors::File::open(root + "/expected.safetensors");
  Loaded l = load(root + "/qk_clip_model", [](TransformerConfig& c) {
    c.track_max_logits = true;
    c.hidden_dropout = 0;
    c.attention_dropout = 0;
  });
  const TransformerConfig& c = l.model->config();
  const Batch batch = oracle_batch(expected);
  const int64_t B = batch.inputs.dim(0), S = batch.inputs.dim(1);
  const QkClip clip{.alpha = expected.read("qk_clip.alpha").item(0),
                    .threshold = expected.read("qk_clip.threshold").item(0),
                    .dtype = DType::kF32};
  const Tensor want_losses = expected.read("qk_clip.losses");
  const Tensor want_max = expected.read("qk_clip.max_logits");  // [steps, layers, heads]
  const Tensor want_clipped = expected.read("qk_clip.clipped");
  std::vector<SelfAttention*> layers = l.model->decoder->self_attentions();
  ASSERT_EQ(static_cast<int64_t>(layers.size()), want_max.dim(1));
  const int64_t heads = want_max.dim(2);
  const int64_t groups = c.mla.enabled ? heads : c.num_query_groups;
  AdamW opt(*l.params, AdamWConfig{0.9, 0.95, 1e-8, 0.1});
  for (int64_t step = 0; step < want_losses.numel(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    GPTModel::Ctx ctx;
    Tensor loss =
        l.model->forward(batch.inputs, batch.labels, Tensor(), ctx, ForwardMode{true, 1, 0});
    EXPECT_NEAR(mean_loss(loss), want_losses.item(step), 1e-4 * want_losses.item(step));
    l.params->zero_grads();
    l.model->backward(Tensor::full({B, S}, 1.0 / static_cast<double>(B * S)), ctx);
    clip_grads(*l.params, 1.0, grad_norm(*l.params));
    opt.step(1e-3);
    int64_t clipped = 0;
    std::vector<RowScale> scales;
    for (size_t i = 0; i < layers.size(); ++i) {
      const Tensor& got = layers[i]->max_logits();
      std::vector<float> m;
      for (int64_t h = 0; h < heads; ++h) {
        m.push_back(static_cast<float>(got.item(h)));
        const double want =
            want_max.item((step * want_max.dim(1) + static_cast<int64_t>(i)) * heads + h);
        EXPECT_NEAR(got.item(h), want, 1e-4 * std::abs(want)) << "layer " << i << " head " << h;
      }
      for (int64_t g = 0; g < groups; ++g) {
        float top = m[static_cast<size_t>(g * heads / groups)];
        for (int64_t h = g * heads / groups; h < (g + 1) * heads / groups; ++h)
          top = std::max(top, m[static_cast<size_t>(h)]);
        clipped += clip.exceeds(top);
      }
      for (RowScale& r : layers[i]->qk_clip_scales(m, clip)) scales.push_back(std::move(r));
      layers[i]->reset_max_logits();
    }
    EXPECT_EQ(clipped, static_cast<int64_t>(want_clipped.item(step)));
    scale_main_rows(*l.params, scales);
  }
}

TEST(PyTorchOracle, Gpt2LogitsLossGradientsAndAdamW) {
  run_oracle("gpt2");
}
TEST(PyTorchOracle, LlamaLogitsLossGradientsAndAdamW) {
  run_oracle("llama");
  run_qk_clip_oracle("llama");  // grouped-query attention: 2 query heads per key
}

// The model variants Hugging Face has, each through its own config: GPT-2 with relu2
// (--squared-relu); Llama 3.1's rope_scaling llama3 with head_dim 32 != hidden / heads
// (--use-rope-scaling, --kv-channels); Qwen3's q_norm / k_norm (--qk-layernorm) with
// rope_scaling linear (--rotary-seq-len-interpolation-factor). The same tolerances.
TEST(PyTorchOracle, VariantsLogitsLossGradientsAndAdamW) {
  for (const std::string arch : {"gpt2-relu2", "llama31", "qwen3"}) {
    SCOPED_TRACE(arch);
    run_oracle(arch);
  }
  // The imported configs are the variants (not silently the plain models).
  EXPECT_TRUE(read_hf_config(g_oracle_dir + "/gpt2-relu2/model").config.squared_relu);
  EXPECT_EQ(read_hf_config(g_oracle_dir + "/llama31/model").config.rope_scaling_factor, 8.0);
  EXPECT_EQ(read_hf_config(g_oracle_dir + "/llama31/model").config.kv_channels, 32);
  const TransformerConfig q = read_hf_config(g_oracle_dir + "/qwen3/model").config;
  EXPECT_TRUE(q.qk_layernorm);
  EXPECT_EQ(q.rotary_seq_len_interpolation_factor, 4.0);
  // Megatron's RoPE variants without a Hugging Face form: the same Llama weights, the flags set
  // here, PyTorch's Megatron-formula rotary embedding on the other side.
  run_oracle("llama-megatron-rope", [](TransformerConfig& c) {
    c.rotary_interleaved = true;
    c.rotary_percent = 0.5;
  });
}

// Mixtral (4 SwiGLU experts, top-2, every layer): with the load-balancing losses off, logits,
// loss, every gradient (router and each expert's w1 / w2 / w3) and 10 AdamW steps as PyTorch, in
// the tolerances above: routing is a top-k of distinct scores (the oracle's router weights are 10x
// the usual scale), so both sides select the same experts and the rest is the same f32 math.
// Llama-Nemotron (nemotron-nas): a heterogeneous model whose four layers are a whole layer with
// 2 query groups and a 256-wide MLP, a linear attention with no MLP, no attention with a 512-wide
// MLP, and a whole attention with 1 query group and a linear MLP. The same tolerances.
TEST(PyTorchOracle, NemotronNasLogitsLossGradientsAndAdamW) {
  run_oracle("nemotron-nas");
  // The imported config is the block list (not a uniform Llama that happens to load).
  const TransformerConfig c = read_hf_config(g_oracle_dir + "/nemotron-nas/model").config;
  ASSERT_EQ(c.heterogeneous.blocks.size(), 4u);
  EXPECT_EQ(c.num_query_groups, 2);  // Megatron's: heads / the first n_heads_in_group
  EXPECT_EQ(c.heterogeneous.blocks[0].ffn_hidden_size, 256);
  EXPECT_EQ(c.heterogeneous.blocks[1].attention, BranchKind::kLinear);
  EXPECT_EQ(c.heterogeneous.blocks[1].mlp, BranchKind::kNoOp);
  EXPECT_EQ(c.heterogeneous.blocks[2].attention, BranchKind::kNoOp);
  EXPECT_EQ(c.heterogeneous.blocks[2].ffn_hidden_size, 512);
  EXPECT_EQ(c.heterogeneous.blocks[3].num_query_groups, 1);
  EXPECT_EQ(c.heterogeneous.blocks[3].mlp, BranchKind::kLinear);
}

TEST(PyTorchOracle, MixtralLogitsLossGradientsAndAdamW) {
  run_oracle("mixtral");
  const TransformerConfig c = read_hf_config(g_oracle_dir + "/mixtral/model").config;
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.router_topk, 2);
  EXPECT_EQ(c.moe.ffn_hidden_size, 48);
  EXPECT_FALSE(c.moe.pre_softmax);  // Mixtral renormalises over the k: Megatron's post-softmax
  EXPECT_EQ(c.moe.num_moe_layers(c.num_layers), c.num_layers);
}

// Qwen2-MoE: q/k/v biases, a dense first layer, then MoE layers of 4 experts, top-2 of the
// softmax without renormalising, with a shared expert scaled per token by sigmoid(x gate_weight)
// (Megatron core 0.19's --moe-shared-expert-gate): logits, loss, every gradient (the gate's
// included) and 10 AdamW steps as PyTorch, in the tolerances above.
TEST(PyTorchOracle, Qwen2MoeLogitsLossGradientsAndAdamW) {
  run_oracle("qwen2-moe");
  const TransformerConfig c = read_hf_config(g_oracle_dir + "/qwen2-moe/model").config;
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_TRUE(c.moe.pre_softmax);  // norm_topk_prob false
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 40);
  EXPECT_TRUE(c.moe.shared_expert_gate);
  EXPECT_TRUE(c.add_qkv_bias);
  EXPECT_FALSE(c.moe.is_moe_layer(0));
  EXPECT_TRUE(c.moe.is_moe_layer(1));
  EXPECT_EQ(c.ffn_hidden_size, 96);  // the dense layer's width
}

// The Hugging Face form chosen for a model trained here: q/k/v biases export as Qwen2 (dense) or,
// with gated shared experts, Qwen2-MoE, and read back as the same model; shared experts without
// the gate, or biases with q/k norms, have no form and are refused.
TEST(HfExportForm, QkvBiasesAndGatedSharedExperts) {
  const TransformerConfig qwen2_moe = read_hf_config(g_oracle_dir + "/qwen2-moe/model").config;
  TransformerConfig dense = qwen2_moe;
  dense.moe = MoeConfig{};
  for (const TransformerConfig& c : {dense, qwen2_moe}) {
    ASSERT_EQ(infer_hf_arch(c), HfArch::kLlama);
    const HfModelInfo info = hf_info_from_config(c, HfArch::kLlama);
    EXPECT_EQ(info.model_type, c.moe.enabled() ? "qwen2_moe" : "qwen2");
    const TransformerConfig back = hf_info_from_json(info.raw, "exported").config;
    EXPECT_TRUE(back.add_qkv_bias) << info.model_type;
    EXPECT_EQ(back.moe.shared_expert_gate, c.moe.enabled()) << info.model_type;
    EXPECT_EQ(back.moe.shared_expert_intermediate_size, c.moe.shared_expert_intermediate_size);
    EXPECT_EQ(back.moe.layer_pattern, c.moe.layer_pattern);
  }
  TransformerConfig ungated = qwen2_moe;
  ungated.moe.shared_expert_gate = false;
  EXPECT_THROW(hf_info_from_config(ungated, HfArch::kLlama), InvalidArgument);
  TransformerConfig normed = dense;
  normed.qk_layernorm = true;
  EXPECT_THROW(infer_hf_arch(normed), InvalidArgument);
}

// DeepSeek-V3: multi-latent attention with a query bottleneck and YaRN (factor 40, a concentration
// factor and softmax scale other than 1), a dense first layer, then MoE layers routed by sigmoid
// scores plus the expert bias (e_score_correction_bias, a frozen tensor without gradient) among 2
// of 4 groups, top-4, scaled by 2.5, with a shared expert: logits, loss, every gradient and 10
// AdamW steps as PyTorch, in the tolerances above (routing on distinct scores, as Mixtral's).
// The plain variant: full-rank q_proj, plain RoPE, value heads wider than the query heads (the
// query and key heads zero-padded to them here).
TEST(PyTorchOracle, DeepSeekV3LogitsLossGradientsAndAdamW) {
  run_oracle("deepseek-v3");
  run_qk_clip_oracle("deepseek-v3");  // multi-latent attention: per head, alpha 0.3
  const TransformerConfig c = read_hf_config(g_oracle_dir + "/deepseek-v3/model").config;
  EXPECT_TRUE(c.mla.enabled);
  EXPECT_TRUE(c.mla.yarn);
  EXPECT_EQ(c.mla.q_lora_rank, 32);
  EXPECT_EQ(c.moe.score_function, MoeScoreFunction::kSigmoid);
  EXPECT_TRUE(c.moe.enable_expert_bias);
  EXPECT_EQ(c.moe.num_groups, 4);
  EXPECT_EQ(c.moe.group_topk, 2);
  EXPECT_EQ(c.moe.topk_scaling_factor, 2.5);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 32);
  EXPECT_EQ(c.moe.num_moe_layers(c.num_layers), 2);
}

// With one multi-token prediction layer (DeepSeek-V3's layer 3 in the files; Megatron's MTP
// forward): every gradient of lm loss + 0.1 x the depth's mean loss, and 10 AdamW steps on that
// objective, as the oracle's restatement of Megatron's MultiTokenPredictionLayer.
TEST(PyTorchOracle, DeepSeekV3MultiTokenPredictionGradientsAndAdamW) {
  run_oracle("deepseek-v3-mtp");
  const TransformerConfig c = read_hf_config(g_oracle_dir + "/deepseek-v3-mtp/model").config;
  EXPECT_EQ(c.mtp_num_layers, 1);
}

TEST(PyTorchOracle, DeepSeekV3PlainLogitsLossGradientsAndAdamW) {
  run_oracle("deepseek-v3-plain");
  const TransformerConfig plain = read_hf_config(g_oracle_dir + "/deepseek-v3-plain/model").config;
  EXPECT_FALSE(plain.mla.yarn);
  EXPECT_EQ(plain.mla.q_lora_rank, 0);
  EXPECT_EQ(plain.head_dim(), 32);  // the value heads' width
}

// With aux loss 0.1 and z-loss 0.01 in training: each layer's losses (logged as loss / coeff, as
// Megatron's tracker) equal the oracle's restatement of Megatron's per-layer formulas, and the
// gradients are those of lm loss + sum over layers of 0.1 aux + 0.01 z. Tolerances: the losses are
// smooth functions of the f32 router logits (~1e-6 relative apart), 1e-5 relative; gradients as
// above.
void expect_per_layer_aux_losses(const std::string& arch, const std::string& router_weight) {
  const std::string root = g_oracle_dir + "/" + arch;
  auto expected = safetensors::File::open(root + "/expected.safetensors");
  Loaded l = load(root + "/model", [](TransformerConfig& c) {
    c.moe.aux_loss_coeff = {0.1};
    c.moe.z_loss_coeff = 0.01;
  });
  const Batch batch = oracle_batch(expected);
  const int64_t B = batch.inputs.dim(0), S = batch.inputs.dim(1);
  MoeAuxTracker tracker(l.model->config().num_layers);
  ForwardMode mode;
  mode.training = true;
  mode.aux_loss_scale = 1.0;  // one micro-batch, no loss scale
  mode.moe_tracker = &tracker;
  GPTModel::Ctx ctx;
  Tensor loss = l.model->forward(batch.inputs, batch.labels, Tensor(), ctx, mode);
  l.params->zero_grads();
  l.model->backward(Tensor::full({B, S}, 1.0 / static_cast<double>(B * S)), ctx);
  const auto& v = tracker.values();
  ASSERT_TRUE(v.count("load_balancing_loss") && v.count("z_loss"));
  for (int64_t i = 0; i < l.model->config().num_layers; ++i) {
    const double aux = expected.read("aux_loss." + std::to_string(i)).item(0);
    const double z = expected.read("z_loss." + std::to_string(i)).item(0);
    EXPECT_NEAR(v.at("load_balancing_loss")[i], aux, 1e-5 * aux) << "layer " << i;
    EXPECT_NEAR(v.at("z_loss")[i], z, 1e-5 * z) << "layer " << i;
  }
  bool router_differs = false;  // the aux terms change the router's gradient visibly
  for (const auto& [name, g] : to_hf_tensors(l.info, *l.model, true)) {
    EXPECT_TRUE(gradient_close(g, expected.read("grad_aux." + name)))
        << "gradient of " << name << " with the auxiliary losses";
    if (name.find(router_weight) != std::string::npos)
      router_differs =
          router_differs || !testing::allclose(g, expected.read("grad." + name), 1e-6, 1e-3);
  }
  EXPECT_TRUE(router_differs) << "the auxiliary losses did not change the router's gradient";
}

TEST(PyTorchOracle, MixtralPerLayerAuxAndZLossesAndTheirGradients) {
  expect_per_layer_aux_losses("mixtral", "gate.weight");
}

// gpt-oss (Megatron core 0.19's flags; the oracle restates Hugging Face's GptOssForCausalLM):
// sliding windows of 4 keys on layers 0 and 2, learned sinks on every head, YaRN with a partial
// ramp (factor 32, unrounded correction range, attention factor 1.35), q/k/v/o biases, head_dim
// 24 != hidden / heads, an MoE of clamped quick-GeGLU experts with biases (their gate_up columns
// interleaved in the files) behind a biased router, top-2 then softmax. The oracle's weights put
// 6.5% of the gates and 15% of the linear halves past the clamp 7, so the clamp's pass-through
// gradients are exercised. Logits, loss, every gradient (sinks, router bias, expert biases
// included) and 10 AdamW/SGD steps within the tolerances above; routing on distinct logits (the
// smallest top-2 margin is 2e-3, a thousand times the f32 differences).
TEST(PyTorchOracle, GptOssLogitsLossGradientsAndAdamW) {
  run_oracle("gpt-oss");
  const TransformerConfig c = read_hf_config(g_oracle_dir + "/gpt-oss/model").config;
  EXPECT_TRUE(c.window_attention);
  EXPECT_EQ(c.window_left, 3);  // Hugging Face's sliding_window 4 counts the query
  EXPECT_EQ(c.window_layers, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(c.softmax_type, SoftmaxType::kLearnable);
  EXPECT_EQ(c.position_embedding, PositionEmbedding::kYarn);
  EXPECT_FALSE(c.yarn_round_to_int);
  EXPECT_TRUE(c.quick_geglu);
  EXPECT_EQ(c.glu_linear_offset, 1.0);
  EXPECT_EQ(c.activation_clamp, 7.0);
  EXPECT_TRUE(c.add_bias_linear);
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.router_topk, 2);
  EXPECT_FALSE(c.moe.pre_softmax);
}

// The same model from OpenAI's published form: the experts' weights in MXFP4 (blocks of E2M1
// pairs and E8M0 scales, quantization_config mxfp4), dequantized on load to exactly the values of
// the unquantized directory (the oracle rounded them to MXFP4 first): every parameter bit for bit.
TEST(PyTorchOracle, GptOssMxfp4ExpertsLoadAsTheUnquantizedWeights) {
  Loaded plain = load(g_oracle_dir + "/gpt-oss/model");
  Loaded mx = load(g_oracle_dir + "/gpt-oss/model_mxfp4");
  ASSERT_EQ(plain.params->params().size(), mx.params->params().size());
  for (size_t i = 0; i < plain.params->params().size(); ++i) {
    const Param& a = *plain.params->params()[i];
    const Param& b = *mx.params->params()[i];
    ASSERT_EQ(a.name, b.name);
    EXPECT_TRUE(testing::allclose(b.main, a.main, 0, 0)) << a.name;
  }
  // The format by hand: the first byte's low nibble is the first value.
  Tensor blocks = Tensor::zeros({2, 3, 16}, DType::kU8), scales = Tensor::zeros({2, 3}, DType::kU8);
  for (int64_t i = 0; i < 6; ++i) scales.data<uint8_t>()[i] = 127;  // 2^0
  blocks.data<uint8_t>()[0] = 0x72;   // low nibble 2 (1.0), high nibble 7 (6.0)
  blocks.data<uint8_t>()[16] = 0x9F;  // group 1: -6.0, then -0.5
  scales.data<uint8_t>()[0] = 128;    // group 0: 2^1
  const Tensor v = dequantize_mxfp4(blocks, scales);
  ASSERT_EQ(v.shape(), (Shape{2, 96}));
  EXPECT_EQ(v.item(0), 2.0);
  EXPECT_EQ(v.item(1), 12.0);
  EXPECT_EQ(v.item(2), 0.0);
  EXPECT_EQ(v.item(32), -6.0);
  EXPECT_EQ(v.item(33), -0.5);
}

// With aux loss 0.1 and z-loss 0.01: Megatron's per-layer losses over the biased router's
// logits, and their gradients (the router bias's included), as for Mixtral.
TEST(PyTorchOracle, GptOssPerLayerAuxAndZLossesAndTheirGradients) {
  expect_per_layer_aux_losses("gpt-oss", "router.weight");
}

// Each variant's oracle tells it from the plain model: the same weights without the variant
// give other logits (beyond the tolerance), so the test above cannot pass by ignoring it.
TEST(PyTorchOracle, VariantsAreDistinguishable) {
  const std::vector<std::pair<std::string, std::function<void(TransformerConfig&)>>> plain = {
      {"gpt2-relu2", [](TransformerConfig& c) { c.squared_relu = false; }},
      {"llama31", [](TransformerConfig& c) { c.rope_scaling_factor = 0; }},
      {"qwen3", [](TransformerConfig& c) { c.rotary_seq_len_interpolation_factor = 0; }},
      {"llama-megatron-rope", [](TransformerConfig& c) { c.rotary_percent = 0.5; }},
      {"llama-megatron-rope", [](TransformerConfig& c) { c.rotary_interleaved = true; }},
      // DeepSeek-V3 without YaRN's frequencies, without its concentration factor and softmax
      // scale (mscale_all_dim), without the expert bias, groups or scaling of its routing.
      {"deepseek-v3", [](TransformerConfig& c) { c.mla.yarn = false; }},
      {"deepseek-v3", [](TransformerConfig& c) { c.mla.mscale_all_dim = c.mla.mscale; }},
      {"deepseek-v3", [](TransformerConfig& c) { c.moe.num_groups = c.moe.group_topk = 0; }},
      {"deepseek-v3", [](TransformerConfig& c) { c.moe.topk_scaling_factor = 0; }},
      // gpt-oss without each of its pieces: windows, YaRN's unrounded range, its attention
      // factor, the clamp, the linear offset (the sinks are parameters: their gradients above).
      {"gpt-oss", [](TransformerConfig& c) { c.window_attention = false; }},
      {"gpt-oss", [](TransformerConfig& c) { c.window_layers.clear(); }},
      {"gpt-oss", [](TransformerConfig& c) { c.yarn_round_to_int = true; }},
      {"gpt-oss", [](TransformerConfig& c) { c.yarn_mscale = 0; }},
      {"gpt-oss", [](TransformerConfig& c) { c.activation_clamp = 0; }},
      {"gpt-oss", [](TransformerConfig& c) { c.glu_linear_offset = 0; }}};
  for (const auto& [arch, undo] : plain) {
    SCOPED_TRACE(arch);
    const std::string root = g_oracle_dir + "/" + arch;
    auto expected = safetensors::File::open(root + "/expected.safetensors");
    Loaded l = load(root + "/model", undo);
    const Batch batch = oracle_batch(expected);
    GPTModel::Ctx ctx;
    l.model->forward(batch.inputs, batch.labels, Tensor(), ctx, ForwardMode{});
    const Tensor got =
        logits_as_pytorch(ctx, l.model->config(), batch.inputs.dim(0), batch.inputs.dim(1));
    EXPECT_FALSE(testing::allclose(got, expected.read("logits"), 1e-5, 1e-4))
        << "the plain model matches too";
  }
}

// --apply-layernorm-1p: the norms hold gamma - 1 and scale by 1 + weight. Imported from the same
// Hugging Face weights (gamma), the model is the same function: PyTorch's logits, loss, gradients
// (d/dweight = d/dgamma) and AdamW losses (norm weights take no weight decay, so the steps in
// weight and in gamma coincide), within the same tolerances. The stored weights are f32(gamma - 1),
// and export writes gamma back to within 6e-8 relative: the round trip gamma -> f32(gamma - 1) ->
// f32(w + 1) rounds twice, each time by at most half an f32 ulp of the value (2^-24 ~ 6e-8 at 1).
TEST(PyTorchOracle, LayerNorm1pIsTheSameFunctionAndExportsGamma) {
  auto one_p = [](TransformerConfig& c) { c.layernorm_zero_centered_gamma = true; };
  run_oracle("gpt2", one_p);
  run_oracle("llama", one_p);
  for (const std::string arch : {"gpt2", "llama"}) {
    const std::string src = g_oracle_dir + "/" + arch + "/model";
    Loaded plain = load(src), centred = load(src, one_p);
    for (size_t i = 0; i < plain.params->params().size(); ++i) {
      const Param& a = *plain.params->params()[i];
      const Param& b = *centred.params->params()[i];
      ASSERT_EQ(a.name, b.name);
      const bool norm = a.name.find("layernorm.weight") != std::string::npos;
      for (int64_t k = 0; k < a.main.numel(); ++k) {
        const double want =
            norm ? static_cast<double>(static_cast<float>(a.main.item(k) - 1.0)) : a.main.item(k);
        ASSERT_EQ(b.main.item(k), want) << a.name << "[" << k << "]";
      }
    }
    const std::string out = testing::scratch_dir("hf_1p_" + arch);
    save_hf(out, centred.info, *centred.model);
    Loaded back = load(out);
    for (size_t i = 0; i < plain.params->params().size(); ++i) {
      const Param& a = *plain.params->params()[i];
      const Param& b = *back.params->params()[i];
      for (int64_t k = 0; k < a.main.numel(); ++k) {
        EXPECT_NEAR(b.main.item(k), a.main.item(k), 6e-8 * std::max(1.0, std::abs(a.main.item(k))))
            << a.name << "[" << k << "]";
      }
    }
  }
}

TEST(PyTorchOracle, ExportReproducesTheImportedFilesExactly) {
  for (const std::string arch :
       {"gpt2", "llama", "gpt2-relu2", "llama31", "qwen3", "mixtral", "qwen2-moe", "deepseek-v3",
        "deepseek-v3-plain", "nemotron-nas", "gpt-oss"}) {  // HF forms
    const std::string src = g_oracle_dir + "/" + arch + "/model";
    Loaded l = load(src);
    const std::string out = testing::scratch_dir("hf_roundtrip_" + arch);
    save_hf(out, l.info, *l.model);
    auto a = safetensors::File::open(src + "/model.safetensors");
    auto b = safetensors::File::open(out + "/model.safetensors");
    ASSERT_EQ(a.tensors().size(), b.tensors().size()) << arch;
    for (const auto& [name, info] : a.tensors()) {
      ASSERT_TRUE(b.contains(name)) << name;
      ASSERT_EQ(info.shape, b.info(name).shape) << name;
      ASSERT_EQ(info.end - info.begin, b.info(name).end - b.info(name).begin) << name;
      EXPECT_EQ(0, std::memcmp(a.data(name), b.data(name), info.end - info.begin))
          << name << " differs after import and export";
    }
    // The exported config.json names the same variant.
    const TransformerConfig in = read_hf_config(src).config, back = read_hf_config(out).config;
    EXPECT_EQ(in.squared_relu, back.squared_relu) << arch;
    EXPECT_EQ(in.qk_layernorm, back.qk_layernorm) << arch;
    EXPECT_EQ(in.kv_channels, back.kv_channels) << arch;
    EXPECT_EQ(in.rope_scaling_factor, back.rope_scaling_factor) << arch;
    EXPECT_EQ(in.rotary_seq_len_interpolation_factor, back.rotary_seq_len_interpolation_factor)
        << arch;
    EXPECT_EQ(in.moe.num_experts, back.moe.num_experts) << arch;
    EXPECT_EQ(in.moe.router_topk, back.moe.router_topk) << arch;
    EXPECT_EQ(in.moe.ffn_hidden_size, back.moe.ffn_hidden_size) << arch;
    EXPECT_EQ(in.moe.layer_pattern, back.moe.layer_pattern) << arch;
    EXPECT_EQ(in.moe.num_groups, back.moe.num_groups) << arch;
    EXPECT_EQ(in.moe.topk_scaling_factor, back.moe.topk_scaling_factor) << arch;
    EXPECT_EQ(in.moe.pre_softmax, back.moe.pre_softmax) << arch;
    EXPECT_EQ(in.moe.shared_expert_intermediate_size, back.moe.shared_expert_intermediate_size)
        << arch;
    EXPECT_EQ(in.moe.shared_expert_gate, back.moe.shared_expert_gate) << arch;
    EXPECT_EQ(in.add_qkv_bias, back.add_qkv_bias) << arch;
    EXPECT_EQ(in.mla.enabled, back.mla.enabled) << arch;
    EXPECT_EQ(in.mla.q_lora_rank, back.mla.q_lora_rank) << arch;
    EXPECT_EQ(in.mla.yarn, back.mla.yarn) << arch;
    EXPECT_EQ(in.mla.mscale_all_dim, back.mla.mscale_all_dim) << arch;
    EXPECT_EQ(in.mtp_num_layers, back.mtp_num_layers) << arch;
    ASSERT_EQ(in.heterogeneous.blocks.size(), back.heterogeneous.blocks.size()) << arch;
    for (size_t i = 0; i < in.heterogeneous.blocks.size(); ++i) {
      const HeterogeneousBlock &x = in.heterogeneous.blocks[i], &y = back.heterogeneous.blocks[i];
      EXPECT_EQ(x.attention, y.attention) << arch << " layer " << i;
      EXPECT_EQ(x.mlp, y.mlp) << arch << " layer " << i;
      EXPECT_EQ(x.num_query_groups, y.num_query_groups) << arch << " layer " << i;
      EXPECT_EQ(x.ffn_hidden_size, y.ffn_hidden_size) << arch << " layer " << i;
    }
  }
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) megatron::g_oracle_dir = argv[1];
  return RUN_ALL_TESTS();
}
