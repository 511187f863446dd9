// Hugging Face's DeepSeek-V3 layout (model_type "deepseek_v3", DeepseekV3ForCausalLM) as Megatron's
// multi-latent attention and MoE flags: what config.json says and where each tensor lives.
//
// Attention (transformer/mla.h): q_a_proj, q_a_layernorm, q_b_proj (or q_proj without
// q_lora_rank), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj are linear_q_down_proj,
// q_layernorm, linear_q_up_proj (linear_q_proj), linear_kv_down_proj, kv_layernorm,
// linear_kv_up_proj and linear_proj, row for row (both order each head [nope | rope] and
// [k_nope | v]); the latent norms are --qk-layernorm. rope_scaling "yarn" is --rope-type yarn with
// its factor, mscale and mscale_all_dim (the other YaRN constants must be Megatron's: original
// context 4096, beta_fast 32, beta_slow 1); none is --rope-type rope.
//
// MoE: the first first_k_dense_replace layers are dense (--moe-layer-freq), the others route by
// sigmoid scores plus e_score_correction_bias (--moe-router-score-function sigmoid,
// --moe-router-enable-expert-bias; the bias is the router's expert_bias), among topk_group of
// n_group groups (--moe-router-num-groups, --moe-router-group-topk), renormalised over the k and
// scaled by routed_scaling_factor (--moe-router-topk-scaling-factor); the n_shared_experts shared
// experts are one MLP of n_shared_experts x moe_intermediate_size
// (--moe-shared-expert-intermediate-size).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/hf_tensors.h"
#include "transformer/transformer_layer.h"

namespace megatron {

// config.json (model_type deepseek_v3) into c. Errors name the file, the key and why.
void read_deepseek_v3_config(const nlohmann::json& j, const std::string& file,
                             TransformerConfig& c);

// config.json for cfg (multi-latent attention, RMSNorm, SwiGLU, no biases; errors name the flags
// a DeepSeek-V3 layout cannot express).
nlohmann::json deepseek_v3_config_json(const TransformerConfig& cfg);

// The router DeepSeek-V3 and Nemotron-H's MoE variants share (topk_method noaux_tc): sigmoid
// scores, e_score_correction_bias for the choice, n_group / topk_group, norm_topk_prob,
// routed_scaling_factor; read into m (scoring_func / topk_method checked where given).
void read_noaux_tc_router(const nlohmann::json& j, const std::string& file, MoeConfig& m);
// InvalidArgument naming the flags when `model`'s router cannot express moe's.
void check_noaux_tc_router_exportable(const MoeConfig& moe, const char* model);
// Its config.json keys (n_routed_experts, num_experts_per_tok, norm_topk_prob,
// routed_scaling_factor, n_group, topk_group).
void write_noaux_tc_router(const MoeConfig& moe, nlohmann::json& j);
// PREFIX + gate.weight and gate.e_score_correction_bias (the router's expert bias).
void add_noaux_tc_router_mappings(const TransformerConfig& c, MoELayer& moe,
                                  const std::string& prefix, std::vector<HfTensorMapping>& maps);

// Layer `layer`'s attention (prefix "model.layers.N.") and, for an MoE layer, its experts, router
// and shared experts.
void add_deepseek_attention_mappings(const TransformerConfig& c, TransformerLayer& layer,
                                     const std::string& prefix, std::vector<HfTensorMapping>& maps);
void add_deepseek_moe_mappings(const TransformerConfig& c, TransformerLayer& layer,
                               const std::string& prefix, std::vector<HfTensorMapping>& maps);

// DeepSeek-V3's multi-token prediction layer N + k (N decoder layers) holds, besides its own
// tensors, copies of the embedding and the output layer (embed_tokens, shared_head.head), which
// Megatron's MTP shares with the model: (copy's name, the shared tensor's name) per depth.
std::vector<std::pair<std::string, std::string>> deepseek_mtp_copies(const TransformerConfig& c);

}  // namespace megatron
