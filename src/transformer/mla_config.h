// MlaConfig: Megatron's multi-latent attention (DeepSeek-V2/V3; MLATransformerConfig), the
// attention of --multi-latent-attention.
//
// Queries come from the hidden state through a low-rank bottleneck (--q-lora-rank; none: one
// full-rank projection), keys and values from a shared latent of --kv-lora-rank channels, plus one
// rotary key of --qk-pos-emb-head-dim channels shared by every head. Each query and key head is
// qk_head_dim "content" channels and qk_pos_emb_head_dim rotary ones; each value head v_head_dim.
// The rotary part turns by YaRN (--rope-type yarn, MLA's default; --rotary-scaling-factor,
// --mscale, --mscale-all-dim) or plain RoPE (--rope-type rope).
#pragma once

#include <cstdint>

namespace megatron {

struct MlaConfig {
  bool enabled = false;                // --multi-latent-attention
  int64_t q_lora_rank = 0;             // --q-lora-rank (0: none, a full-rank linear_q_proj)
  int64_t kv_lora_rank = 32;           // --kv-lora-rank
  int64_t qk_head_dim = 128;           // --qk-head-dim
  int64_t qk_pos_emb_head_dim = 64;    // --qk-pos-emb-head-dim
  int64_t v_head_dim = 128;            // --v-head-dim
  bool yarn = true;                    // --rope-type yarn (MLA's default) or rope
  double rotary_scaling_factor = 1.0;  // --rotary-scaling-factor (YaRN's factor)
  double mscale = 1.0;                 // --mscale
  double mscale_all_dim = 0.0;         // --mscale-all-dim
  // MLATransformerConfig's YaRN defaults, which Megatron's arguments do not set (DeepSeek-V2 and
  // V3 use them; a Hugging Face config with others is refused on import).
  double original_max_position_embeddings = 4096;
  double beta_fast = 32, beta_slow = 1;

  // The width of a query or key head.
  int64_t q_head_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }
  // YaRN's _yarn_get_mscale(factor, m): 1 up to factor 1, 0.1 m ln(factor) + 1 beyond.
  static double yarn_mscale(double factor, double m);
  // The scale of q . k: yarn_mscale(factor, mscale_all_dim)^2 / sqrt(q_head_dim), for either
  // rope type (as Megatron's MultiLatentAttention.softmax_scale).
  double softmax_scale() const;
  // YaRN's concentration factor on cos and sin: yarn_mscale(factor, mscale) /
  // yarn_mscale(factor, mscale_all_dim); 1 for --rope-type rope.
  double rope_mscale() const;
  // Checks the sizes; errors name the flags.
  void validate() const;
};

}  // namespace megatron
