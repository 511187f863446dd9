// TransformerConfig: the shape and numerics of a transformer stack, as Megatron's
// TransformerConfig holds them. One field per concern, each with its unit and default. Built by the
// CLI from Megatron's flags or from a Hugging Face config.json; validated once by validate().
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "parallel/fp8_config.h"
#include "transformer/heterogeneous_config.h"
#include "transformer/mamba/mamba_config.h"
#include "transformer/mla_config.h"
#include "transformer/moe/moe_config.h"
#include "transformer/vision_config.h"

namespace megatron {

enum class Normalization : uint8_t { kLayerNorm, kRMSNorm };
// kRelative: T5's bucketed relative-position bias on the self-attention scores
// (transformer/relative_position.h).
enum class PositionEmbedding : uint8_t { kLearnedAbsolute, kRope, kNone, kRelative, kYarn };
// --softmax-type (Megatron core 0.19): the attention softmax, or with a sink logit per head in the
// denominator: 0 (off-by-one) or a learned one (learnable: core_attention.softmax_offset).
enum class SoftmaxType : uint8_t { kVanilla, kOffByOne, kLearnable };
// Megatron's activation recomputation (see TransformerBlock and SelfAttention).
enum class RecomputeGranularity : uint8_t { kNone, kFull, kSelective };
enum class RecomputeMethod : uint8_t { kNone, kUniform, kBlock };
// Megatron's --recompute-modules: what selective recomputation recomputes. core_attn, mlp, moe and
// shared_experts keep their module's input and run the module again in backward; moe_act,
// layernorm and mla_up_proj drop their outputs (the experts' activation, multi-latent attention's
// up-projected and rotated q, k, v) and rebuild them from what they were computed from.
struct RecomputeModules {
  bool core_attn = true;  // Megatron's default
  bool mlp = false, moe = false, shared_experts = false, moe_act = false, mla_up_proj = false;
  // The input and pre-MLP norms' outputs (output-discarding; an MoE layer's pre-MLP norm only
  // with moe, where the layer's kept input is that output).
  bool layernorm = false;
};

struct TransformerConfig {
  int64_t num_layers = 0;   // --num-layers
  int64_t hidden_size = 0;  // --hidden-size
  int64_t ffn_hidden_size =
      0;  // --ffn-hidden-size (0: 4 * hidden, or 8/3 rounded for SwiGLU by the CLI)
  int64_t num_attention_heads = 0;      // --num-attention-heads
  int64_t num_query_groups = 0;         // --num-query-groups (0: = heads, i.e. no GQA)
  int64_t kv_channels = 0;              // --kv-channels (0: hidden / heads)
  int64_t seq_length = 0;               // --seq-length
  int64_t max_position_embeddings = 0;  // --max-position-embeddings (0: = seq_length)
  int64_t vocab_size = 0;               // real vocabulary (tokenizer size)
  int64_t padded_vocab_size = 0;        // rows of the embedding, see pad_vocab_size()

  Normalization normalization = Normalization::kLayerNorm;  // --normalization
  // --transformer-block-type post_ln: the original Transformer's (and BERT's) norm placement, a
  // norm after each residual add and one on the embeddings, none at the end of the block
  // (transformer/transformer_layer.h). Default pre_ln, Megatron's only placement.
  bool post_layernorm = false;
  // BERT's sentence-order head (token types, pooler, binary head); --bert-no-binary-head clears it.
  bool bert_binary_head = true;
  // A BERT sequence classifier's classes (`megatron finetune --task`); 0: pretraining heads.
  int64_t num_classes = 0;
  double norm_epsilon = 1e-5;  // --norm-epsilon
  // --apply-layernorm-1p: the norms' weights are stored centred on zero (gamma = 1 + weight,
  // weight initialised to 0), as Megatron's zero_centered_gamma.
  bool layernorm_zero_centered_gamma = false;
  bool swiglu = false;  // --swiglu
  // --gated-linear-unit: a gated MLP with the GELU activation, GeGLU (T5 v1.1, HF's gated-gelu);
  // fc1 is twice as wide, [gate | up], as with SwiGLU. --openai-gelu makes it tanh GELU.
  bool gated_gelu = false;
  bool openai_gelu = false;   // --openai-gelu: tanh GELU (HF gelu_new) instead of exact erf
  bool squared_relu = false;  // --squared-relu: relu(x)^2 instead of GELU
  // x sigmoid(1.702 x) instead of GELU: CLIP's vision towers (Megatron's quick_gelu, set by the
  // vision model's config as examples/multimodal does; no language-model flag).
  bool quick_gelu = false;
  // --quick-geglu (gpt-oss): the gated MLP with quick GELU, out = quick_gelu(gate) (up +
  // glu_linear_offset) over fc1's [gate | up]; with activation_clamp > 0 the gate is clamped
  // above at it and up to [-clamp, clamp] first (--activation-func-clamp-value; 0: no clamp).
  bool quick_geglu = false;
  double glu_linear_offset = 0;  // --glu-linear-offset
  double activation_clamp = 0;   // --activation-func-clamp-value
  // --window-size L,R: sliding-window attention, each query sees the L keys before it (R after
  // it: 0 in causal models; -1 unbounded). window_layers (--window-attn-skip-freq): one entry per
  // layer, 1 where the layer uses the window; empty: every layer (Megatron's
  // is_layer_window_attention).
  // window_skip_every: the integer form's N (0 for a list), which MTP layers apply to their own
  // numbers.
  bool window_attention = false;
  int64_t window_left = -1, window_right = 0;
  std::vector<int> window_layers;
  int64_t window_skip_every = 0;
  // ops::AttentionSpec::window of layer `layer` (a decoder layer, or an MTP layer past them, in
  // our 0-based numbering): window_left, or -1 without a window. Megatron's rule applies to its
  // 1-based layer numbers: a decoder layer's is layer + 1; MTP layers number their own from 1
  // (GPT: depth k's layer is k + 1, a repeated block's 1; a hybrid MTP block's layer j is j + 1).
  int64_t attention_window(int64_t layer) const;
  SoftmaxType softmax_type = SoftmaxType::kVanilla;  // --softmax-type
  // --qk-clip or --log-max-attention-logit: training forwards raise each self-attention head's
  // largest score (SelfAttention::max_logits; the trainer's train/qk_clip.h reads and resets it).
  bool track_max_logits = false;
  // --position-embedding-type yarn on (non-MLA) attention, Megatron core 0.19's YarnRotaryEmbedding
  // from --rotary-scaling-factor, --yarn-original-max-position-embeddings, --yarn-beta-fast,
  // --yarn-beta-slow, --mscale, --mscale-all-dim and --yarn-correction-range-round-to-int; cos and
  // sin are multiplied by the concentration factor yarn_mscale(f, mscale) / yarn_mscale(f,
  // mscale_all_dim) (MlaConfig::yarn_mscale).
  double yarn_factor = 1, yarn_original_max_positions = 4096, yarn_beta_fast = 32,
         yarn_beta_slow = 1, yarn_mscale = 1, yarn_mscale_all_dim = 0;
  bool yarn_round_to_int = true;
  bool qk_layernorm = false;  // --qk-layernorm: a norm over each query and key head
  // --attention-output-gate (Megatron core 0.19; Qwen3-Next's gated attention): linear_qkv also
  // produces a gate per query channel (per group: the queries, their gates, the key, the value)
  // and the attention's output is multiplied by sigmoid(gate) before linear_proj.
  bool attention_output_gate = false;
  // --qk-l2-norm (Llama 4): q_layernorm and k_layernorm are Megatron's L2Norm instead, RMS
  // normalisation without a weight (eps --norm-epsilon), before RoPE; wins over qk_layernorm.
  bool qk_l2_norm = false;
  // --no-rope-freq: one entry per decoder layer, 1 where the layer skips RoPE (Llama 4's NoPE
  // layers); empty: every layer rotates.
  std::vector<int> no_rope_layers;
  bool skips_rope(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(no_rope_layers.size()) &&
           no_rope_layers[static_cast<size_t>(layer)] != 0;
  }
  // --init-method-xavier-uniform: linear weights U(-a, a), a = sqrt(6 / (fan_in + fan_out))
  bool init_method_xavier_uniform = false;
  double embedding_init_method_std = 0;  // --embedding-init-method-std; 0: init_method_std
  bool add_bias_linear = true;           // false with --disable-bias-linear
  bool add_qkv_bias = false;  // --add-qkv-bias (QKV bias even when linear biases are off)
  PositionEmbedding position_embedding = PositionEmbedding::kLearnedAbsolute;
  double rotary_base = 10000;       // --rotary-base
  double rotary_percent = 1.0;      // --rotary-percent
  bool rotary_interleaved = false;  // --rotary-interleaved: rotate pairs (2j, 2j + 1)
  double rope_scaling_factor = 0;  // --use-rope-scaling's --rope-scaling-factor (Llama 3.1); 0: off
  double rotary_seq_len_interpolation_factor = 0;  // positions divided by it; 0: off
  bool untie_embeddings_and_output_weights = false;
  // T5 (--position-embedding-type relative): buckets and the distance beyond which all share one.
  int64_t relative_attention_num_buckets = 32;    // --relative-attention-num-buckets
  int64_t relative_attention_max_distance = 128;  // --relative-attention-max-distance
  // The scale of the attention scores; 0: 1/sqrt(kv_channels). Hugging Face's T5 has none (1),
  // its initialisation absorbing it; Megatron's TransformerConfig.softmax_scale.
  double softmax_scale = 0;
  // Encoder-decoder models (T5): the decoder's layers and sequence length; num_layers and
  // seq_length are the encoder's (--encoder-num-layers, --encoder-seq-length).
  int64_t decoder_num_layers = 0;  // --decoder-num-layers
  int64_t decoder_seq_length = 0;  // --decoder-seq-length

  // Maximal Update Parameterization (Megatron core 0.19's --use-mup): width_mult = hidden size /
  // --mup-base-hidden-size. The model (GPTModel) draws its matrices with std / sqrt(width_mult)
  // (the embeddings and an untied output layer with the embeddings' std), scales the embedding
  // sum by embedding_mult and the logits by output_mult (1 / width_mult unless given); the
  // attention scale is set from it by the CLI; the optimizer's hidden matrices take lr /
  // width_mult (Param::mup_class).
  struct Mup {
    bool enabled = false;
    double width_mult = 1, embedding_mult = 1, output_mult = 1;
  } mup;

  double hidden_dropout = 0.1;     // --hidden-dropout
  double attention_dropout = 0.1;  // --attention-dropout
  double init_method_std = 0.02;   // --init-method-std

  DType compute_dtype = DType::kF32;  // kBF16 with --bf16

  // --recompute-granularity: kFull re-runs whole layers in backward, kSelective only the core
  // attention (default kNone: every activation is kept).
  RecomputeGranularity recompute_granularity = RecomputeGranularity::kNone;
  // --recompute-method (kFull only): kUniform chunks of recompute_num_layers layers, kBlock the
  // first recompute_num_layers layers of each pipeline stage (default kNone).
  RecomputeMethod recompute_method = RecomputeMethod::kNone;
  int64_t recompute_num_layers = 0;  // --recompute-num-layers, >= 1 with kFull (default 0: unset)
  // --distribute-saved-activations (kFull, TP > 1, no SP): each recomputed segment's input is
  // kept as this TP rank's 1/tp of its elements and all-gathered before the recomputation.
  bool distribute_saved_activations = false;
  RecomputeModules recompute_modules;  // --recompute-modules (with kSelective)
  // Whether selective recomputation covers a module (the flag's name for it).
  bool recomputes(bool RecomputeModules::*module) const {
    return recompute_granularity == RecomputeGranularity::kSelective && recompute_modules.*module;
  }

  MoeConfig moe;  // Mixture of Experts (--num-experts; default: dense)
  MlaConfig mla;  // multi-latent attention (--multi-latent-attention; default: off)
  // A hybrid Mamba model's layer types and Mamba sizes (megatron pretrain_mamba; default: none).
  MambaConfig mamba;
  // Layers that differ (--heterogeneous-layers-config-path: Llama-Nemotron's block list; default:
  // every layer alike). for_layer() gives a layer its own sizes.
  HeterogeneousConfig heterogeneous;
  // Multi-token prediction (models/gpt/mtp.h): depths after the decoder (--mtp-num-layers; 0:
  // none) and the weight of their mean loss in the objective (--mtp-loss-scaling-factor).
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;
  // --mtp-use-repeated-layer (Megatron core 0.19's mtp_use_repeated_layer): one block applied at
  // every depth; --mtp-detach-heads (mtp_detach_heads): the depths read the decoder's output and
  // the embeddings detached.
  bool mtp_use_repeated_layer = false;
  bool mtp_detach_heads = false;
  // Layers of one MTP depth: a hybrid model's MTP pattern's (mamba.mtp_layers), else GPT's one.
  int64_t mtp_layers_per_depth() const {
    return mamba.mtp_layers.empty() ? 1 : static_cast<int64_t>(mamba.mtp_layers.size());
  }
  // MTP blocks holding parameters: one per depth, or one in all when repeated.
  int64_t mtp_blocks() const {
    return mtp_use_repeated_layer ? std::min<int64_t>(mtp_num_layers, 1) : mtp_num_layers;
  }
  // Layer numbers in use: the decoder's, then every MTP block's layers (MoE statistics; a
  // repeated block's applications share its numbers).
  int64_t layer_slots() const { return num_layers + mtp_blocks() * mtp_layers_per_depth(); }
  // Whether layer `layer` (a decoder or MTP layer number) is an MoE layer: a hybrid model's E
  // layers, else --moe-layer-freq's (an MTP layer: the decoder's last layer's kind).
  bool is_moe_layer(int64_t layer) const {
    return mamba.enabled() ? mamba.layer_type(layer) == 'E' : moe.is_moe_layer(layer);
  }
  Fp8Config fp8;  // FP8 GEMMs (--fp8-format; default: off)
  // A vision-language model's vision encoder and projector (--model llava; default: none).
  // seq_length is then the language model's combined sequence (text and image embeddings).
  VisionConfig vision;

  // The width of the heads the core attention sees: kv_channels, or under multi-latent attention
  // the wider of a query (key) head and a value head (the narrower one zero-padded to it).
  int64_t head_dim() const {
    return mla.enabled ? std::max(mla.q_head_dim(), mla.v_head_dim) : kv_channels;
  }
  // The width of a value head: the heads' outputs linear_proj takes.
  int64_t v_head_dim() const { return mla.enabled ? mla.v_head_dim : kv_channels; }
  int64_t queries_per_group() const { return num_attention_heads / num_query_groups; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  // fc1 computes [gate | up] (SwiGLU or GeGLU).
  bool gated_mlp() const { return swiglu || gated_gelu || quick_geglu; }
  // The scale attention applies to q . k.
  double attention_scale() const;
  // Megatron's output_layer_init_method std (linear_proj, fc2, the experts' fc2, Mamba's
  // out_proj): init_method_std / sqrt(2 layers), or / sqrt(layers) in a hybrid model (its
  // is_hybrid_model, set by a hybrid pattern in core 0.19).
  double output_init_std() const;

  // Layer `layer`'s config (0-based, global): this one with the heterogeneous block's query
  // groups and MLP width (Megatron's get_config_for_layer), without the block list.
  TransformerConfig for_layer(int64_t layer) const;

  // Fills derived defaults (ffn, groups, kv_channels, max positions) and checks consistency;
  // errors name the flag.
  void finalize();
};

// Megatron's padding: the smallest multiple of divisible_by * tp >= vocab.
int64_t pad_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp = 1);

}  // namespace megatron
