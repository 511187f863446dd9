// Activation recomputation (Megatron's --recompute-granularity full|selective): bit-identical to
// keeping every activation, and the memory it saves, counted exactly.
//
// What it is: for a tiny GPT-2-style (LayerNorm, GELU, biases, learned positions) and a
// Llama-style (RMSNorm, SwiGLU, no biases, RoPE, GQA, document masks) TransformerConfig in f32
// with hidden and attention dropout on, a TransformerBlock and a whole GPTModel under every
// recompute setting give the same output, input gradient and parameter gradients as without
// recomputation, compared bit for bit (no tolerance: the recomputation runs the same kernels on
// the same inputs with the same dropout coordinates, so any difference is a bug). The
// ParamsDone calls come in the same order with the same parameters. The activation bytes a
// block's Ctx holds after forward are counted twice, independently: by walking the Ctx structs
// (distinct storages) and by the allocator's live-bytes counter, and both must equal the
// formula below exactly. The segment layout of each method is checked as a pure function.
//
// What it is not: a tensor-parallel test (collectives re-issued by the recomputation are covered
// end to end by test_recompute_cli.py under mpiexec); bf16 gets the bit-identity check only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "models/gpt/gpt_memory.h"
#include "models/gpt/gpt_model.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "testing/testing.h"
#include "train/memory_report.h"
#include "transformer/transformer_block.h"

namespace megatron {
namespace {

// ---- configurations ----

// 4 layers, h 64, 4 heads of 16, s 32 (with b 2 below): the sizes the memory numbers in
// docs/ are quoted for.
TransformerConfig gpt2_config() {
  TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 32;
  c.vocab_size = 97;
  c.padded_vocab_size = 128;
  c.openai_gelu = true;
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  c.init_method_std = 0.1;  // large enough that every path carries signal
  c.compute_dtype = DType::kF32;
  c.finalize();
  return c;
}

TransformerConfig llama_config() {
  TransformerConfig c = gpt2_config();
  c.num_query_groups = 2;
  c.ffn_hidden_size = 128;  // Megatron's SwiGLU size for h 64: int(4 * 64 * 2/3 / 64) * 64
  c.normalization = Normalization::kRMSNorm;
  c.swiglu = true;
  c.openai_gelu = false;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRope;
  c.untie_embeddings_and_output_weights = true;
  c.finalize();
  return c;
}

// Llama-Nemotron's heterogeneous layers on the Llama-style block: a whole layer of its own
// (1 query group, MLP 96 wide), a linear attention and no MLP, no attention and the model's MLP,
// and the model's attention with a linear MLP.
TransformerConfig heterogeneous_config() {
  TransformerConfig c = llama_config();
  c.heterogeneous.blocks = {
      {BranchKind::kWhole, BranchKind::kWhole, 1, 96},
      {BranchKind::kLinear, BranchKind::kNoOp, 0, 0},
      {BranchKind::kNoOp, BranchKind::kWhole, 0, 0},
      {BranchKind::kWhole, BranchKind::kLinear, 0, 0},
  };
  c.heterogeneous.json = "{}";
  c.finalize();
  return c;
}

struct Setting {
  const char* name;
  RecomputeGranularity granularity;
  RecomputeMethod method;
  int64_t num_layers;
  RecomputeModules modules = {};  // --recompute-modules (default: core_attn)
};

RecomputeModules modules(bool core_attn, bool mlp, bool layernorm = false) {
  RecomputeModules m;
  m.core_attn = core_attn;
  m.mlp = mlp;
  m.layernorm = layernorm;
  return m;
}

const Setting kNone{"none", RecomputeGranularity::kNone, RecomputeMethod::kNone, 0};
const std::vector<Setting> kRecomputeSettings = {
    {"full_uniform_1", RecomputeGranularity::kFull, RecomputeMethod::kUniform, 1},
    {"full_uniform_2", RecomputeGranularity::kFull, RecomputeMethod::kUniform, 2},
    {"full_uniform_3", RecomputeGranularity::kFull, RecomputeMethod::kUniform, 3},  // 3 + 1
    {"full_block_1", RecomputeGranularity::kFull, RecomputeMethod::kBlock, 1},
    {"full_block_2", RecomputeGranularity::kFull, RecomputeMethod::kBlock, 2},
    {"selective", RecomputeGranularity::kSelective, RecomputeMethod::kNone, 0},
    // --recompute-modules core_attn mlp, and mlp alone.
    {"selective_core_attn_mlp", RecomputeGranularity::kSelective, RecomputeMethod::kNone, 0,
     modules(true, true)},
    {"selective_mlp", RecomputeGranularity::kSelective, RecomputeMethod::kNone, 0,
     modules(false, true)},
    // --recompute-modules layernorm, alone and with core_attn mlp.
    {"selective_layernorm", RecomputeGranularity::kSelective, RecomputeMethod::kNone, 0,
     modules(false, false, true)},
    {"selective_core_attn_mlp_layernorm", RecomputeGranularity::kSelective, RecomputeMethod::kNone,
     0, modules(true, true, true)},
};

TransformerConfig with(TransformerConfig c, const Setting& s) {
  c.recompute_granularity = s.granularity;
  c.recompute_method = s.method;
  c.recompute_num_layers = s.num_layers;
  c.recompute_modules = s.modules;
  return c;
}

constexpr int64_t kBatch = 2;
const ForwardMode kTraining{true, 1234, 7};  // dropout on

// Documents of 10 tokens (--reset-attention-mask) in the Llama-style runs, so the Ctx's kept
// layout (doc_start) is exercised by the recomputation too.
TokenLayout layout_for(const TransformerConfig& c) {
  TokenLayout l;
  if (c.position_embedding == PositionEmbedding::kRope) {
    l.doc_start = Tensor::empty({kBatch, c.seq_length}, DType::kI32);
    int32_t* d = l.doc_start.data<int32_t>();
    for (int64_t i = 0; i < kBatch; ++i)
      for (int64_t t = 0; t < c.seq_length; ++t)
        d[i * c.seq_length + t] = static_cast<int32_t>(t / 10 * 10);
  }
  return l;
}

// ---- bitwise comparison ----

::testing::AssertionResult bitwise_equal(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure() << "got " << got.str() << ", want " << want.str();
  }
  if (std::memcmp(got.raw(), want.raw(), got.nbytes()) == 0) return ::testing::AssertionSuccess();
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (got.item(i) != want.item(i)) {
      if (first < 0) first = i;
      ++differ;
    }
  }
  return ::testing::AssertionFailure()
         << differ << " of " << got.numel() << " elements differ; first at " << first << ": got "
         << got.item(first) << ", want " << want.item(first);
}

// ---- one forward + backward of a block ----

struct BlockRun {
  Tensor out, dx, grads;
  std::vector<std::vector<std::string>> done_calls;  // ParamsDone, in call order
};

struct BlockFixture {
  std::shared_ptr<ProcessGroup> group = make_self_process_group();
  TransformerConfig cfg;
  TransformerBlock block;
  ParamSet params;

  BlockFixture(const TransformerConfig& c, bool final_norm = true)
      : cfg(c),
        block("decoder", cfg, TensorParallelContext{group.get(), false, {}}, 0, cfg.num_layers,
              final_norm),
        params(collect(block), DType::kF32) {
    params.initialize(42);
    // Norm weights and biases away from 1 / 0, so their gradients are generic.
    for (Param* p : params.params()) {
      if (p->init != Init::kNormal) {
        ops::add_inplace(p->main, testing::random_tensor(p->shape, stable_hash(p->name), 0.2));
      }
    }
    params.sync_compute_from_main();
  }
  static std::vector<Param*> collect(TransformerBlock& b) {
    std::vector<Param*> ps;
    b.collect(ps);
    return ps;
  }
  Tensor input() const {
    return testing::random_tensor({cfg.seq_length, kBatch, cfg.hidden_size}, 5);
  }

  BlockRun run() {
    BlockRun r;
    const Tensor x = input();
    const Tensor dy = testing::random_tensor(x.shape(), 6);
    const TokenLayout layout = layout_for(cfg);
    TransformerBlock::Ctx ctx;
    r.out = block.forward(x, layout, ctx, kTraining).clone();
    params.zero_grads();
    r.dx = block.backward(dy, ctx, [&r](const std::vector<const Param*>& ps) {
      std::vector<std::string> names;
      for (const Param* p : ps) names.push_back(p->name);
      r.done_calls.push_back(names);
    });
    r.grads = params.grads().clone();
    return r;
  }
};

// Every parameter's gradient in `got` equals the one in `want`, bit for bit; the failure names
// the parameter.
void expect_same_grads(const ParamSet& params, const Tensor& got, const Tensor& want) {
  for (const Param* p : params.params()) {
    const int64_t off = params.offset_of(*p);
    EXPECT_TRUE(bitwise_equal(got.flat_view(off, p->shape), want.flat_view(off, p->shape)))
        << p->name;
  }
}

void expect_same_block_run(const TransformerConfig& base, bool final_norm) {
  BlockFixture ref(with(base, kNone), final_norm);
  BlockRun want = ref.run();
  // Every parameter received a gradient: a dead path would compare equal trivially.
  for (const Param* p : ref.params.params()) {
    double sum = 0;
    for (int64_t i = 0; i < p->main_grad.numel(); ++i) sum += std::fabs(p->main_grad.item(i));
    EXPECT_GT(sum, 0) << p->name;
  }
  for (const Setting& s : kRecomputeSettings) {
    SCOPED_TRACE(s.name);
    BlockFixture f(with(base, s), final_norm);
    BlockRun got = f.run();
    EXPECT_TRUE(bitwise_equal(got.out, want.out)) << "output";
    EXPECT_TRUE(bitwise_equal(got.dx, want.dx)) << "input gradient";
    expect_same_grads(f.params, got.grads, want.grads);
    EXPECT_EQ(got.done_calls, want.done_calls);
  }
}

TEST(Recompute, Gpt2StyleBlockBitIdentical) {
  expect_same_block_run(gpt2_config(), true);
}
TEST(Recompute, LlamaStyleBlockBitIdentical) {
  expect_same_block_run(llama_config(), true);
}

TEST(Recompute, HeterogeneousBlockBitIdentical) {
  expect_same_block_run(heterogeneous_config(), true);
}

// A block without the final norm (a pipeline stage that does not end the decoder): its output is
// the last layer's, recomputed or not.
TEST(Recompute, StageWithoutFinalNormBitIdentical) {
  expect_same_block_run(gpt2_config(), false);
}

// ---- the whole model: embeddings (with dropout), decoder, loss ----

struct ModelRun {
  Tensor loss, grads;
};

ModelRun run_model(const TransformerConfig& c) {
  GPTModel model(c);
  ParamSet params(model.parameters(), c.compute_dtype);
  params.initialize(42);
  const Tensor tokens = testing::random_ids({kBatch, c.seq_length}, 8, c.vocab_size);
  const Tensor labels = testing::random_ids({kBatch, c.seq_length}, 9, c.vocab_size);
  const TokenLayout layout = layout_for(c);
  GPTModel::Ctx ctx;
  ModelRun r;
  r.loss = model.forward(tokens, labels, Tensor(), ctx, kTraining, layout.doc_start).clone();
  Tensor dloss = Tensor::full(r.loss.shape(), 1.0 / static_cast<double>(r.loss.numel()));
  params.zero_grads();
  model.backward(dloss, ctx);
  r.grads = params.grads().clone();
  return r;
}

TEST(Recompute, GptModelBitIdentical) {
  for (const TransformerConfig& base : {gpt2_config(), llama_config()}) {
    SCOPED_TRACE(base.swiglu ? "llama" : "gpt2");
    ModelRun want = run_model(with(base, kNone));
    for (const Setting& s : kRecomputeSettings) {
      SCOPED_TRACE(s.name);
      ModelRun got = run_model(with(base, s));
      EXPECT_TRUE(bitwise_equal(got.loss, want.loss)) << "per-token loss";
      EXPECT_TRUE(bitwise_equal(got.grads, want.grads)) << "parameter gradients (flat buffer)";
    }
  }
}

// --recompute-modules on a DeepSeek-V3-style model (multi-latent attention, a dense layer then MoE
// layers with a shared expert, sigmoid routing with an aux loss), dropout on: every module set
// gives the loss and every gradient bit for bit, and after forward the recomputed modules hold
// what they should not (checked on a layer's Ctx): MLA's packed q, k, v and the up projections'
// saved inputs; the experts' activation and its scaled copy; the shared experts' and the dense
// MLP's intermediates; the whole MoE layer's state (only its input and mode kept).
TransformerConfig deepseek_config() {
  TransformerConfig c = llama_config();
  c.num_query_groups = 0;
  c.kv_channels = 0;
  c.mla.enabled = true;
  c.mla.q_lora_rank = 24;
  c.mla.kv_lora_rank = 16;
  c.mla.qk_head_dim = 16;
  c.mla.qk_pos_emb_head_dim = 8;
  c.mla.v_head_dim = 12;
  c.mla.rotary_scaling_factor = 40;
  c.mla.mscale_all_dim = 1.0;
  c.qk_layernorm = true;
  c.moe.num_experts = 4;
  c.moe.router_topk = 2;
  c.moe.ffn_hidden_size = 32;
  c.moe.shared_expert_intermediate_size = 32;
  c.moe.layer_pattern = {0, 1, 1, 1};
  c.moe.score_function = MoeScoreFunction::kSigmoid;
  c.moe.aux_loss_coeff = {0.01};
  c.finalize();
  return c;
}

TransformerConfig with_modules(TransformerConfig c, const RecomputeModules& m) {
  c.recompute_granularity = RecomputeGranularity::kSelective;
  c.recompute_modules = m;
  return c;
}

// One training step of a GPTModel (seed 42, fixed tokens, dropout on, aux losses at scale 1):
// the per-token loss and the flat gradients. after_forward inspects the Ctx before backward (and
// may set the MTP depths' loss gradients).
ModelRun run_training_step(const TransformerConfig& c,
                           const std::function<void(GPTModel::Ctx&)>& after_forward) {
  ForwardMode mode = kTraining;
  mode.aux_loss_scale = 1.0;
  GPTModel model(c);
  ParamSet params(model.parameters(), c.compute_dtype);
  params.initialize(42);
  const Tensor tokens = testing::random_ids({kBatch, c.seq_length}, 8, c.vocab_size);
  const Tensor labels = testing::random_ids({kBatch, c.seq_length}, 9, c.vocab_size);
  GPTModel::Ctx ctx;
  ModelRun r;
  r.loss = model.forward(tokens, labels, Tensor(), ctx, mode).clone();
  after_forward(ctx);
  Tensor dloss = Tensor::full(r.loss.shape(), 1.0 / static_cast<double>(r.loss.numel()));
  params.zero_grads();
  model.backward(dloss, ctx);
  r.grads = params.grads().clone();
  return r;
}

TEST(Recompute, ModulesGiveTheSameBitsAndDropTheirActivations) {
  const TransformerConfig base = deepseek_config();
  const auto run = [&](const TransformerConfig& c) {
    return run_training_step(c, [&](GPTModel::Ctx& ctx) {
      // What the modules dropped, on layer 1 (MoE) and layer 0 (dense).
      const TransformerLayer::Ctx& moe_layer = ctx.decoder.layers[1];
      const TransformerLayer::Ctx& dense = ctx.decoder.layers[0];
      const RecomputeModules& m = c.recompute_modules;
      const bool on = c.recompute_granularity == RecomputeGranularity::kSelective;
      EXPECT_EQ(moe_layer.attn.qkv.defined(), !(on && m.mla_up_proj));
      EXPECT_EQ(moe_layer.attn.mla.kv_up.linear.x.defined(), !(on && m.mla_up_proj));
      // moe keeps the layer's input, which is the pre-MLP norm's output layernorm drops.
      EXPECT_EQ(moe_layer.moe_input.defined(), on && m.moe && !m.layernorm);
      EXPECT_EQ(moe_layer.ln2_dropped, on && m.moe && m.layernorm);
      if (!(on && m.moe)) {
        EXPECT_EQ(moe_layer.moe.experts.act.defined(), !(on && m.moe_act));
        EXPECT_EQ(moe_layer.moe.shared.pre_act.defined(), !(on && m.shared_experts));
      }
      EXPECT_EQ(dense.mlp.pre_act.defined(), !(on && m.mlp));
      // layernorm: the down projections' saved input (the input norm's output) is gone; the dense
      // MLP's (its input, or fc1's saved input) too.
      EXPECT_EQ(moe_layer.attn.mla.kv_down.x.defined(), !(on && m.layernorm));
      EXPECT_EQ(dense.mlp.input.defined() || dense.mlp.fc1_ctx.linear.x.defined(),
                !(on && m.layernorm));
    });
  };
  const ModelRun want = run(base);
  RecomputeModules up_act_shared;
  up_act_shared.mla_up_proj = up_act_shared.moe_act = up_act_shared.shared_experts = true;
  up_act_shared.layernorm = true;
  RecomputeModules moe_mlp;
  moe_mlp.core_attn = false;
  moe_mlp.moe = moe_mlp.mlp = moe_mlp.mla_up_proj = moe_mlp.layernorm = true;
  for (const RecomputeModules& m : {up_act_shared, moe_mlp}) {
    const ModelRun got = run(with_modules(base, m));
    EXPECT_TRUE(bitwise_equal(got.loss, want.loss)) << "per-token loss";
    EXPECT_TRUE(bitwise_equal(got.grads, want.grads)) << "parameter gradients (flat buffer)";
  }
}

// Multi-token prediction under --recompute-granularity full (uniform, one layer), as Megatron
// recomputes each depth's norms, eh_proj, transformer layer and final norm: the main and the
// depths' losses and every gradient bit for bit, the depths' activations dropped after forward
// (block leaves them, as Megatron skips MTP recomputation there).
TEST(Recompute, MultiTokenPredictionBitIdentical) {
  TransformerConfig base = deepseek_config();
  base.mtp_num_layers = 2;
  base.finalize();
  struct Run {
    ModelRun r;
    std::vector<Tensor> mtp;
  };
  const auto run = [&](const TransformerConfig& c, bool dropped) {
    Run out;
    out.r = run_training_step(c, [&](GPTModel::Ctx& ctx) {
      EXPECT_EQ(ctx.mtp_losses.size(), 2u);
      for (const MultiTokenPrediction::Ctx::Depth& d : ctx.mtp.depths) {
        EXPECT_EQ(d.e.x.defined(), !dropped);
        EXPECT_EQ(d.proj.linear.x.defined(), !dropped);
        EXPECT_EQ(d.e_in.defined(), dropped);
      }
      for (const Tensor& l : ctx.mtp_losses) {
        out.mtp.push_back(l.clone());
        ctx.mtp_dlosses.push_back(Tensor::full(l.shape(), 0.5 / static_cast<double>(l.numel())));
      }
    });
    return out;
  };
  const Run want = run(base, false);
  TransformerConfig uniform = base, block = base;
  uniform.recompute_granularity = block.recompute_granularity = RecomputeGranularity::kFull;
  uniform.recompute_method = RecomputeMethod::kUniform;
  block.recompute_method = RecomputeMethod::kBlock;
  uniform.recompute_num_layers = block.recompute_num_layers = 1;
  for (const auto& [c, dropped] : {std::pair{uniform, true}, std::pair{block, false}}) {
    SCOPED_TRACE(dropped ? "uniform" : "block");
    const Run got = run(c, dropped);
    EXPECT_TRUE(bitwise_equal(got.r.loss, want.r.loss)) << "per-token loss";
    for (size_t k = 0; k < want.mtp.size(); ++k)
      EXPECT_TRUE(bitwise_equal(got.mtp[k], want.mtp[k])) << "mtp depth " << k + 1;
    EXPECT_TRUE(bitwise_equal(got.r.grads, want.r.grads)) << "parameter gradients (flat buffer)";
  }
}

// bf16 weights: linear_proj keeps its own bf16 copy of the core attention's output, so
// selective recomputation drops only the f32 `out` and `lse` (nothing to re-link).
TEST(Recompute, GptModelBf16BitIdentical) {
  TransformerConfig base = gpt2_config();
  base.compute_dtype = DType::kBF16;
  ModelRun want = run_model(with(base, kNone));
  // The bf16 path is the one running: its loss is not the f32 one.
  EXPECT_FALSE(bitwise_equal(want.loss, run_model(with(gpt2_config(), kNone)).loss));
  for (const Setting& s : kRecomputeSettings) {
    SCOPED_TRACE(s.name);
    ModelRun got = run_model(with(base, s));
    EXPECT_TRUE(bitwise_equal(got.loss, want.loss)) << "per-token loss";
    EXPECT_TRUE(bitwise_equal(got.grads, want.grads)) << "parameter gradients (flat buffer)";
  }
}

// ---- activation memory ----

// Distinct storages a block's Ctx keeps alive, by data pointer (a view shares its tensor's
// storage: the first layer's input is the block's input, linear_qkv's saved input is the
// input norm's output, linear_proj's saved input is the core attention's `out`). The caller's
// layout tensors are not counted: the block only borrows them.
class HeldBytes {
 public:
  void add(const Tensor& t) {
    if (!t.defined()) return;
    size_t& b = bytes_[t.raw()];
    b = std::max(b, t.nbytes());
  }
  void add(const Linear::Ctx& c) { add(c.x); }
  void add(const ColumnParallelLinear::Ctx& c) { add(c.linear); }
  void add(const RowParallelLinear::Ctx& c) { add(c.linear); }
  void add(const Norm::Ctx& c) {
    add(c.x);
    add(c.mean);
    add(c.rstd);
  }
  void add(const SelfAttention::Ctx& c) {
    add(c.qkv_ctx);
    add(c.proj_ctx);
    add(c.qkv);
    add(c.out);
    add(c.lse);
    add(c.positions);
    add(c.spec.doc_start);
    add(c.spec.key_valid);
    add(c.spec.bias);
  }
  void add(const MLP::Ctx& c) {
    add(c.fc1_ctx);
    add(c.fc2_ctx);
    add(c.pre_act);
    add(c.input);
  }
  void add(const TransformerLayer::Ctx& c) {
    add(c.ln1);
    add(c.attn);
    add(c.ln2);
    add(c.mlp);
    add(c.linear_attention);
    add(c.linear_mlp);
  }
  void add(const TransformerBlock::Ctx& c) {
    for (const auto& l : c.layers) add(l);
    for (const Tensor& t : c.segment_inputs) add(t);
    add(c.final_norm);
  }
  void exclude(const Tensor& t) {
    if (t.defined()) bytes_.erase(t.raw());
  }
  bool holds(const Tensor& t) const { return bytes_.count(t.raw()) > 0; }
  int64_t total() const {
    size_t n = 0;
    for (const auto& [p, b] : bytes_) n += b;
    return static_cast<int64_t>(n);
  }

 private:
  std::map<const void*, size_t> bytes_;
};

// Predicted bytes held by a block's Ctx after forward (f32, no tensor parallelism; s b h, np
// heads of hn, ng query groups, f = ffn_hidden_size, L layers, floats of 4 bytes).
//
// Without recomputation a layer keeps
//   A = 4 sbh            (its input, both norm outputs = the GEMM inputs, the residual x1)
//     + 2 (2 sb | sb)    (mean and rstd of both norms; LayerNorm | RMSNorm's rstd only)
//     + sb (np + 2 ng) hn  (packed qkv after RoPE)
//     + sb np hn + b np s  (core attention's out, also linear_proj's input, and lse)
//     + sb (f | 2f) + sb f (fc1 output before the activation: GELU | SwiGLU, and fc2's input)
// and the final norm keeps F = sbh + (2 sb | sb) (its input, the last layer's output).
//   none:               L A + F
//   full uniform N:     ceil(L / N) sbh + F        (one [s, b, h] input per chunk)
//   full block N:       N sbh + (L - N) A + F      (the first N layers keep their input only)
//   selective:          L (A - sb np hn - b np s) + F
//     with mlp:         the MLP keeps its input (the second norm's output) alone: minus
//                       L (sb (f | 2f) + sb f); without core_attn the core output stays
//     with layernorm:   both norms' outputs go: minus L 2 sbh
// (Dropout masks are never stored: they are regenerated from their counters.)
int64_t predicted_held_bytes(const TransformerConfig& c, const Setting& s, bool final_norm) {
  const int64_t sq = c.seq_length, b = kBatch, h = c.hidden_size, L = c.num_layers;
  const int64_t np = c.num_attention_heads, ng = c.num_query_groups, hn = c.head_dim();
  const int64_t f = c.ffn_hidden_size, sb = sq * b;
  const int64_t stats = c.normalization == Normalization::kLayerNorm ? 2 * sb : sb;
  const int64_t core = sb * np * hn + b * np * sq;
  const int64_t A = 4 * sb * h + 2 * stats + sb * (np + 2 * ng) * hn + core +
                    sb * (c.swiglu ? 2 * f : f) + sb * f;
  const int64_t F = final_norm ? sb * h + stats : 0;
  int64_t floats = 0;
  if (s.granularity == RecomputeGranularity::kNone) {
    floats = L * A + F;
  } else if (s.granularity == RecomputeGranularity::kSelective) {
    const int64_t mlp = sb * (c.swiglu ? 2 * f : f) + sb * f;
    floats = L * (A - (s.modules.core_attn ? core : 0) - (s.modules.mlp ? mlp : 0) -
                  (s.modules.layernorm ? 2 * sb * h : 0)) +
             F;
  } else if (s.method == RecomputeMethod::kUniform) {
    floats = (L + s.num_layers - 1) / s.num_layers * sb * h + F;
  } else {
    floats = s.num_layers * sb * h + (L - s.num_layers) * A + F;
  }
  return floats * 4;
}

void check_memory(const TransformerConfig& base, const char* model) {
  std::vector<Setting> all = {kNone};
  all.insert(all.end(), kRecomputeSettings.begin(), kRecomputeSettings.end());
  for (const Setting& s : all) {
    SCOPED_TRACE(s.name);
    BlockFixture f(with(base, s));
    const Tensor x = f.input();
    const Tensor dy = testing::random_tensor(x.shape(), 6);
    const TokenLayout layout = layout_for(f.cfg);
    TransformerBlock::Ctx ctx;

    const int64_t live_before = live_tensor_bytes();
    Tensor out = f.block.forward(x, layout, ctx, kTraining);
    const int64_t live_after = live_tensor_bytes();

    HeldBytes held;
    held.add(ctx);
    held.add(ctx.layout.positions);
    held.exclude(layout.positions);
    held.exclude(layout.doc_start);
    const int64_t predicted = predicted_held_bytes(f.cfg, s, true);
    EXPECT_EQ(held.total(), predicted) << "walking the Ctx";
    // The allocator's view: forward's new live bytes are the held ones except the input (alive
    // before), plus the output when the Ctx does not hold it.
    ASSERT_TRUE(held.holds(x));
    const int64_t from_allocator = live_after - live_before + static_cast<int64_t>(x.nbytes()) -
                                   (held.holds(out) ? 0 : static_cast<int64_t>(out.nbytes()));
    EXPECT_EQ(from_allocator, predicted) << "allocator live bytes";

    // Peak during backward, above what was live when it started (reported, not asserted: it
    // depends on the order buffers are freed in).
    reset_peak_tensor_bytes();
    const int64_t live_bwd = live_tensor_bytes();
    Tensor dx = f.block.backward(dy, ctx);
    const int64_t bwd_peak = peak_tensor_bytes() - live_bwd;
    std::cout << "[ memory   ] " << model << " L=" << base.num_layers << " h=" << base.hidden_size
              << " s=" << base.seq_length << " b=" << kBatch << " " << s.name
              << ": held after forward " << held.total() << " bytes (predicted " << predicted
              << "), backward peak +" << bwd_peak << " bytes\n";
  }
}

TEST(Recompute, Gpt2StyleHeldActivationBytesMatchFormula) {
  check_memory(gpt2_config(), "gpt2");
}
TEST(Recompute, LlamaStyleHeldActivationBytesMatchFormula) {
  check_memory(llama_config(), "llama");
}

// The trainer's start-up estimate (train/memory_report.h) uses the same per-layer bookkeeping:
// for a block without final norm, fp32, no tensor parallelism, it must equal the measured formula.
TEST(Recompute, TrainerActivationEstimateIsTheMeasuredFormula) {
  for (const TransformerConfig& base : {gpt2_config(), llama_config()}) {
    std::vector<Setting> all = {kNone};
    all.insert(all.end(), kRecomputeSettings.begin(), kRecomputeSettings.end());
    for (const Setting& s : all) {
      const TransformerConfig c = with(base, s);
      ActivationShape shape{.micro_batch_size = kBatch,
                            .num_layers = c.num_layers,
                            .pre_process = false,
                            .post_process = false};
      EXPECT_EQ(activation_bytes_per_microbatch(c, shape), predicted_held_bytes(c, s, false))
          << s.name;
    }
  }
}

// A heterogeneous block's held bytes, walked from its Ctx, against the trainer's estimate (each
// layer's own branches and sizes) plus the final norm's input and statistics, without and with
// every recomputation (selective: only whole branches recompute; full block: the layers after the
// first n keep their own kinds' activations).
TEST(Recompute, HeterogeneousHeldActivationBytesMatchTheEstimate) {
  const TransformerConfig base = heterogeneous_config();
  std::vector<Setting> settings = {kNone};
  settings.insert(settings.end(), kRecomputeSettings.begin(), kRecomputeSettings.end());
  for (const Setting& s : settings) {
    SCOPED_TRACE(s.name);
    BlockFixture f(with(base, s));
    const Tensor x = f.input();
    const TokenLayout layout = layout_for(f.cfg);
    TransformerBlock::Ctx ctx;
    f.block.forward(x, layout, ctx, kTraining);
    HeldBytes held;
    held.add(ctx);
    held.add(ctx.layout.positions);
    held.exclude(layout.positions);
    held.exclude(layout.doc_start);
    const int64_t sb = f.cfg.seq_length * kBatch;
    const int64_t final_norm = (sb * f.cfg.hidden_size + sb) * 4;  // input and RMSNorm's rstd
    ActivationShape shape{.micro_batch_size = kBatch,
                          .num_layers = f.cfg.num_layers,
                          .pre_process = false,
                          .post_process = false};
    EXPECT_EQ(held.total(), activation_bytes_per_microbatch(f.cfg, shape) + final_norm);
    // Not the uniform model's count: the blocks change it (except under full uniform
    // recomputation, which keeps only each chunk's input).
    TransformerConfig uniform = f.cfg;
    uniform.heterogeneous = {};
    if (s.method != RecomputeMethod::kUniform) {
      EXPECT_NE(held.total(), activation_bytes_per_microbatch(uniform, shape) + final_norm);
    }
  }
}

// ---- the segments of each method (a pure function) ----

std::string describe(const std::vector<TransformerBlock::Segment>& segs) {
  std::string s;
  for (const auto& g : segs) {
    s += "[" + std::to_string(g.begin) + "," + std::to_string(g.end) + ")" +
         (g.recompute ? "r" : "");
  }
  return s;
}

TEST(RecomputeSegments, EachMethod) {
  TransformerConfig c = gpt2_config();
  EXPECT_EQ(describe(recompute_segments(c, 4)), "[0,1)[1,2)[2,3)[3,4)");
  c.recompute_granularity = RecomputeGranularity::kSelective;
  EXPECT_EQ(describe(recompute_segments(c, 4)), "[0,1)[1,2)[2,3)[3,4)");
  c.recompute_granularity = RecomputeGranularity::kFull;
  c.recompute_method = RecomputeMethod::kUniform;
  c.recompute_num_layers = 1;
  EXPECT_EQ(describe(recompute_segments(c, 4)), "[0,1)r[1,2)r[2,3)r[3,4)r");
  c.recompute_num_layers = 3;
  EXPECT_EQ(describe(recompute_segments(c, 4)), "[0,3)r[3,4)r");
  c.recompute_num_layers = 8;  // more than the stage holds: one chunk
  EXPECT_EQ(describe(recompute_segments(c, 4)), "[0,4)r");
  c.recompute_method = RecomputeMethod::kBlock;
  c.recompute_num_layers = 2;
  EXPECT_EQ(describe(recompute_segments(c, 4)), "[0,1)r[1,2)r[2,3)[3,4)");
  c.recompute_num_layers = 4;
  EXPECT_EQ(describe(recompute_segments(c, 3)), "[0,1)r[1,2)r[2,3)r");  // a smaller model chunk
  EXPECT_EQ(describe(recompute_segments(c, 0)), "");
}

TEST(RecomputeSegments, RefusesInconsistentSettings) {
  TransformerConfig c = gpt2_config();
  c.recompute_granularity = RecomputeGranularity::kFull;
  EXPECT_THROW(recompute_segments(c, 4), InvalidArgument);  // no method
  c.recompute_method = RecomputeMethod::kUniform;
  c.recompute_num_layers = 0;
  EXPECT_THROW(recompute_segments(c, 4), InvalidArgument);
  c.recompute_granularity = RecomputeGranularity::kSelective;
  c.recompute_num_layers = 1;
  EXPECT_THROW(recompute_segments(c, 4), InvalidArgument);  // a method without full
  c.recompute_granularity = RecomputeGranularity::kNone;
  EXPECT_THROW(recompute_segments(c, 4), InvalidArgument);
}

}  // namespace
}  // namespace megatron
