// TransformerConfig defaults and consistency checks (messages name Megatron's flags), and
// Megatron's vocabulary padding.
#include "transformer/config.h"

#include <cmath>

#include "core/error.h"

namespace megatron {

TransformerConfig TransformerConfig::for_layer(int64_t layer) const {
  TransformerConfig c = *this;
  c.heterogeneous = HeterogeneousConfig{};
  if (const HeterogeneousBlock* b = heterogeneous.block(layer)) {
    if (b->num_query_groups > 0) c.num_query_groups = b->num_query_groups;
    if (b->ffn_hidden_size > 0) c.ffn_hidden_size = b->ffn_hidden_size;
  }
  return c;
}

void TransformerConfig::finalize() {
  MEGATRON_CHECK(num_layers > 0, "--num-layers must be positive, got ", num_layers);
  MEGATRON_CHECK(hidden_size > 0, "--hidden-size must be positive, got ", hidden_size);
  MEGATRON_CHECK(num_attention_heads > 0, "--num-attention-heads must be positive, got ",
                 num_attention_heads);
  MEGATRON_CHECK(!attention_output_gate || !mla.enabled,
                 "Output gate is not supported for MLA yet: drop --attention-output-gate or "
                 "--multi-latent-attention");
  if (kv_channels == 0) {
    MEGATRON_CHECK(hidden_size % num_attention_heads == 0, "--hidden-size (", hidden_size,
                   ") must be divisible by --num-attention-heads (", num_attention_heads,
                   "), or set --kv-channels explicitly");
    kv_channels = hidden_size / num_attention_heads;
  }
  if (mla.enabled) {
    mla.validate();
    MEGATRON_CHECK(num_query_groups == 0 || num_query_groups == num_attention_heads,
                   "--num-query-groups (", num_query_groups,
                   ") with --multi-latent-attention: every head has its own key and value from the "
                   "shared latent; drop --group-query-attention");
    MEGATRON_CHECK(!rotary_interleaved,
                   "--rotary-interleaved does not work with --multi-latent-attention (as in "
                   "Megatron)");
    MEGATRON_CHECK(rope_scaling_factor == 0 && rotary_seq_len_interpolation_factor == 0,
                   "--use-rope-scaling and --rotary-seq-len-interpolation-factor do not apply to "
                   "--multi-latent-attention: its rotary part scales by YaRN (--rope-type yarn, "
                   "--rotary-scaling-factor)");
    MEGATRON_CHECK(position_embedding != PositionEmbedding::kRelative,
                   "--position-embedding-type relative does not work with "
                   "--multi-latent-attention");
  }
  MEGATRON_CHECK(mtp_num_layers >= 0, "--mtp-num-layers must be >= 0, got ", mtp_num_layers);
  if (mtp_num_layers > 0) {
    MEGATRON_CHECK(position_embedding == PositionEmbedding::kRope ||
                       position_embedding == PositionEmbedding::kYarn ||
                       position_embedding == PositionEmbedding::kNone,
                   "--mtp-num-layers needs --position-embedding-type rope, yarn or none (as in "
                   "Megatron: the rolled tokens have no learned positions)");
  }
  if (mamba.enabled()) {
    mamba.validate(num_layers, hidden_size, 1);
    MEGATRON_CHECK(!post_layernorm,
                   "hybrid Mamba models are pre-LN: drop "
                   "--transformer-block-type post_ln");
    // Megatron builds no MTP block for a hybrid model without an MTP pattern (a warning only);
    // here that is refused rather than trained without the depths asked for.
    MEGATRON_CHECK(mtp_num_layers == 0 || !mamba.mtp_layers.empty(), "--mtp-num-layers ",
                   mtp_num_layers,
                   " with a hybrid model needs the MTP layers' pattern: --hybrid-layer-pattern "
                   "'MAIN/MTP/MTP...' (one /MTP per depth) or --mtp-hybrid-override-pattern MTP");
    MEGATRON_CHECK(mamba.mtp_layers.empty() || mtp_num_layers > 0,
                   "an MTP layer pattern without --mtp-num-layers");
    MEGATRON_CHECK(mamba.mtp_layers.find('E') == std::string::npos || moe.enabled(),
                   "the MTP layer pattern '", mamba.mtp_layers,
                   "' has E layers: they need --num-experts");
    for (int64_t l = 0; l < layer_slots(); ++l)
      MEGATRON_CHECK(moe.is_moe_layer(l) == (mamba.layer_type(l) == 'E'), "layer ", l,
                     " of the hybrid pattern '", mamba.layers, "' is ",
                     moe.is_moe_layer(l) ? "an MoE layer but not E" : "E but not an MoE layer",
                     ": a hybrid model's MoE layers are exactly its E layers");
  } else {
    MEGATRON_CHECK(mamba.mtp_layers.empty(), "an MTP layer pattern needs a hybrid model");
  }
  if (heterogeneous.enabled()) {
    const char* flag = "--heterogeneous-layers-config-path";
    MEGATRON_CHECK(static_cast<int64_t>(heterogeneous.blocks.size()) == num_layers, flag,
                   ": its block_configs has ", heterogeneous.blocks.size(),
                   " layers, --num-layers is ", num_layers);
    MEGATRON_CHECK(!mla.enabled, flag,
                   " with --multi-latent-attention is not supported (as in Megatron)");
    MEGATRON_CHECK(!moe.enabled(), flag,
                   " with --num-experts: Megatron's heterogeneous layers have dense MLPs");
    MEGATRON_CHECK(!mamba.enabled(), flag, " does not apply to hybrid Mamba models");
    MEGATRON_CHECK(!post_layernorm, flag, ": heterogeneous layers are pre-LN");
    MEGATRON_CHECK(decoder_num_layers == 0, flag, " shapes decoder-only (GPT) models");
    MEGATRON_CHECK(mtp_num_layers == 0, flag,
                   " with --mtp-num-layers is not implemented (the block list has no entry for "
                   "the prediction depths)");
    for (size_t i = 0; i < heterogeneous.blocks.size(); ++i) {
      const int64_t g = heterogeneous.blocks[i].num_query_groups;
      MEGATRON_CHECK(g == 0 || num_attention_heads % g == 0, flag, ": layer ", i, "'s ", g,
                     " query groups do not divide --num-attention-heads (", num_attention_heads,
                     ")");
    }
  }
  if (num_query_groups == 0) num_query_groups = num_attention_heads;
  MEGATRON_CHECK(num_attention_heads % num_query_groups == 0, "--num-attention-heads (",
                 num_attention_heads, ") must be divisible by --num-query-groups (",
                 num_query_groups, ")");
  if (ffn_hidden_size == 0) ffn_hidden_size = 4 * hidden_size;
  if (max_position_embeddings == 0) max_position_embeddings = seq_length;
  MEGATRON_CHECK(seq_length > 0, "--seq-length must be positive, got ", seq_length);
  if (position_embedding == PositionEmbedding::kLearnedAbsolute) {
    MEGATRON_CHECK(seq_length <= max_position_embeddings, "--seq-length (", seq_length,
                   ") exceeds --max-position-embeddings (", max_position_embeddings,
                   "): learned position embeddings have no row for the later positions (with "
                   "--pretrained-checkpoint, the limit is the checkpoint's config.json)");
  }
  MEGATRON_CHECK(vocab_size > 0, "vocabulary size must be positive (set --vocab-size)");
  if (padded_vocab_size == 0) padded_vocab_size = vocab_size;
  MEGATRON_CHECK(padded_vocab_size >= vocab_size, "padded vocabulary ", padded_vocab_size,
                 " is smaller than the vocabulary ", vocab_size);
  MEGATRON_CHECK(hidden_dropout >= 0 && hidden_dropout < 1,
                 "--hidden-dropout must be in [0, 1), got ", hidden_dropout);
  MEGATRON_CHECK(attention_dropout >= 0 && attention_dropout < 1,
                 "--attention-dropout must be in [0, 1), got ", attention_dropout);
  MEGATRON_CHECK(norm_epsilon > 0, "--norm-epsilon must be positive, got ", norm_epsilon);
  MEGATRON_CHECK(init_method_std > 0, "--init-method-std must be positive, got ", init_method_std);
  if (moe.enabled() && moe.ffn_hidden_size == 0) moe.ffn_hidden_size = ffn_hidden_size;
  // A hybrid model's MoE pattern covers its MTP layers too (model_config: one entry per slot).
  moe.validate(mamba.enabled() && moe.enabled() && !moe.layer_pattern.empty() ? layer_slots()
                                                                              : num_layers);
  // Megatron's SharedExpertMLP asserts it (routers and experts take biases since core 0.19).
  MEGATRON_CHECK(!moe.enabled() || moe.shared_expert_intermediate_size == 0 || !add_bias_linear,
                 "bias is not supported in the shared experts (Megatron's SharedExpertMLP): add "
                 "--disable-bias-linear with --moe-shared-expert-intermediate-size");
  // Megatron's TransformerConfig checks, in its words.
  MEGATRON_CHECK(!moe.router_padding_for_fp8 || fp8.enabled(),
                 "--moe-router-padding-for-fp8: fp8 must be specified when "
                 "moe_router_padding_for_fp8 is True (pass --fp8-format, or drop the flag)");
  MEGATRON_CHECK(!moe.router_padding_for_fp8 || moe.dispatcher == MoeDispatcher::kAllToAll,
                 "--moe-router-padding-for-fp8: allgather and alltoall_seq dispatcher does not "
                 "support moe_router_padding_for_fp8 (pass --moe-token-dispatcher-type alltoall)");
  MEGATRON_CHECK(!(swiglu && gated_gelu), "--swiglu and --gated-linear-unit are exclusive");
  MEGATRON_CHECK(softmax_scale >= 0, "the attention softmax scale must be positive, got ",
                 softmax_scale);
  if (position_embedding == PositionEmbedding::kRelative) {
    MEGATRON_CHECK(relative_attention_num_buckets >= 4,
                   "--relative-attention-num-buckets must be >= 4, got ",
                   relative_attention_num_buckets);
    // The causal buckets' exact range is num_buckets / 2: the logarithmic ones span from there
    // to max_distance, which must lie beyond it (else log(max_distance / exact) is 0).
    MEGATRON_CHECK(relative_attention_max_distance > relative_attention_num_buckets / 2,
                   "--relative-attention-max-distance (", relative_attention_max_distance,
                   ") must exceed half of --relative-attention-num-buckets (",
                   relative_attention_num_buckets, ")");
  }
  if (position_embedding == PositionEmbedding::kRope ||
      position_embedding == PositionEmbedding::kYarn) {
    MEGATRON_CHECK(rotary_percent > 0 && rotary_percent <= 1,
                   "--rotary-percent must be in (0, 1], got ", rotary_percent);
    MEGATRON_CHECK(rope_scaling_factor >= 0, "--rope-scaling-factor must be positive, got ",
                   rope_scaling_factor);
    MEGATRON_CHECK(rotary_seq_len_interpolation_factor >= 0,
                   "--rotary-seq-len-interpolation-factor must be positive, got ",
                   rotary_seq_len_interpolation_factor);
    // MLA turns its own rotary channels (qk_pos_emb_head_dim, checked by mla.validate()); YaRN
    // the whole head whatever --rotary-percent says.
    const int64_t rot =
        mla.enabled ? 2
        : position_embedding == PositionEmbedding::kYarn
            ? kv_channels
            : static_cast<int64_t>(static_cast<double>(kv_channels) * rotary_percent);
    MEGATRON_CHECK(rot >= 2 && rot % 2 == 0,
                   "rotary dimension kv_channels * --rotary-percent = ", rot,
                   " must be even and >= 2");
  }
}

int64_t TransformerConfig::attention_window(int64_t layer) const {
  if (!window_attention) return -1;
  if (window_layers.empty()) return window_left;
  int64_t number = layer + 1;  // Megatron's layer_number
  if (layer >= num_layers) {
    const int64_t slot = layer - num_layers, per_depth = mtp_layers_per_depth();
    number = mamba.enabled() ? slot % per_depth + 1 : slot / per_depth + 1;
  }
  if (window_skip_every > 0) return number % window_skip_every != 0 ? window_left : -1;
  const bool windowed = number - 1 < static_cast<int64_t>(window_layers.size()) &&
                        window_layers[static_cast<size_t>(number - 1)] != 0;
  return windowed ? window_left : -1;
}

double TransformerConfig::output_init_std() const {
  const double multiplier = mamba.enabled() ? 1.0 : 2.0;
  return init_method_std / std::sqrt(multiplier * static_cast<double>(num_layers));
}

double TransformerConfig::attention_scale() const {
  // Megatron's multi-latent attention hands its own scale to the core attention.
  if (mla.enabled) return mla.softmax_scale();
  return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(kv_channels));
}

int64_t pad_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp) {
  MEGATRON_CHECK(divisible_by > 0, "--make-vocab-size-divisible-by must be positive, got ",
                 divisible_by);
  int64_t multiple = divisible_by * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

}  // namespace megatron
