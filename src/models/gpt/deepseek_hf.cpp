// DeepSeek-V3's config.json keys and tensor names (see deepseek_hf.h).
#include "models/gpt/deepseek_hf.h"

#include <cmath>

namespace megatron {
using nlohmann::json;

namespace {

void add(std::vector<HfTensorMapping>& maps, const std::string& name, Param& p, Shape shape,
         int64_t row_begin = 0) {
  maps.push_back(HfTensorMapping{name, &p, row_begin, {}, false, shape, 0.0});
}

void read_moe(const json& j, const std::string& file, TransformerConfig& c) {
  const int64_t experts = hf_get_or<int64_t>(j, "n_routed_experts", 0, file);
  if (experts == 0) return;
  MoeConfig& m = c.moe;
  m.num_experts = experts;
  m.router_topk = hf_get<int64_t>(j, "num_experts_per_tok", file);
  m.ffn_hidden_size = hf_get<int64_t>(j, "moe_intermediate_size", file);
  m.shared_expert_intermediate_size =
      hf_get_or<int64_t>(j, "n_shared_experts", 0, file) * m.ffn_hidden_size;
  MEGATRON_CHECK(hf_get_or<int64_t>(j, "moe_layer_freq", 1, file) == 1, file,
                 ": moe_layer_freq other than 1 is not supported (DeepSeek-V3 has 1)");
  const int64_t dense = hf_get_or<int64_t>(j, "first_k_dense_replace", 0, file);
  MEGATRON_CHECK(dense >= 0 && dense <= c.num_layers, file, ": first_k_dense_replace ", dense,
                 " is outside [0, num_hidden_layers]");
  m.layer_pattern.clear();
  if (dense > 0) {
    for (int64_t i = 0; i < c.num_layers; ++i) m.layer_pattern.push_back(i < dense ? 0 : 1);
  }
  read_noaux_tc_router(j, file, m);
}

}  // namespace

void read_noaux_tc_router(const json& j, const std::string& file, MoeConfig& m) {
  const std::string scoring = hf_get_or<std::string>(j, "scoring_func", "sigmoid", file);
  const std::string method = hf_get_or<std::string>(j, "topk_method", "noaux_tc", file);
  MEGATRON_CHECK(scoring == "sigmoid" && method == "noaux_tc", file, ": scoring_func '", scoring,
                 "' with topk_method '", method,
                 "' is not supported (DeepSeek-V3's sigmoid with noaux_tc)");
  m.score_function = MoeScoreFunction::kSigmoid;
  m.enable_expert_bias = true;
  // Megatron's sigmoid router renormalises over the k selected exactly when k > 1 (a top-1
  // token keeps its raw score; Hugging Face's norm_topk_prob would make it 1).
  const bool norm = hf_get_or<bool>(j, "norm_topk_prob", true, file);
  MEGATRON_CHECK(norm == (m.router_topk > 1), file, ": norm_topk_prob ", norm ? "true" : "false",
                 " with num_experts_per_tok ", m.router_topk,
                 " is not supported (Megatron renormalises sigmoid scores over the k selected "
                 "exactly when k > 1)");
  const double scaling = hf_get_or<double>(j, "routed_scaling_factor", 1.0, file);
  m.topk_scaling_factor = scaling == 1.0 ? 0.0 : scaling;
  const int64_t groups = hf_get_or<int64_t>(j, "n_group", 1, file);
  const int64_t group_topk = hf_get_or<int64_t>(j, "topk_group", 1, file);
  if (groups > 1) {
    // Hugging Face scores a group by the sum of its top 2 experts, Megatron by its top
    // k / group_topk: they agree when that is 2 (DeepSeek-V3: 8 / 4).
    MEGATRON_CHECK(m.router_topk == 2 * group_topk, file, ": num_experts_per_tok ", m.router_topk,
                   " with topk_group ", group_topk,
                   " scores groups differently in Megatron (top num_experts_per_tok / topk_group "
                   "experts) and Hugging Face (top 2); only num_experts_per_tok = 2 x topk_group "
                   "loads");
    m.num_groups = groups;
    m.group_topk = group_topk;
  }
  m.aux_loss_coeff = {0.0};  // a training choice (--moe-aux-loss-coeff), not the model's
}

void check_noaux_tc_router_exportable(const MoeConfig& moe, const char* model) {
  MEGATRON_CHECK(moe.score_function == MoeScoreFunction::kSigmoid && moe.enable_expert_bias &&
                     !moe.pre_softmax && !moe.has(MoeLoadBalancing::kSinkhorn),
                 "this MoE model has no Hugging Face equivalent: ", model,
                 " routes by sigmoid scores with an expert bias (--moe-router-score-function "
                 "sigmoid --moe-router-enable-expert-bias)");
  MEGATRON_CHECK(!moe.apply_probs_on_input,
                 "this MoE model has no Hugging Face equivalent: ", model,
                 " weights the experts' outputs, not their inputs (drop "
                 "--moe-apply-probs-on-input)");
  MEGATRON_CHECK(moe.num_groups <= 1 || moe.router_topk == 2 * moe.group_topk,
                 "this MoE model has no Hugging Face equivalent: ", model,
                 " scores an expert group by its top 2 experts (--moe-router-topk = 2 x "
                 "--moe-router-group-topk)");
}

void write_noaux_tc_router(const MoeConfig& moe, json& j) {
  j["n_routed_experts"] = moe.num_experts;
  j["num_experts_per_tok"] = moe.router_topk;
  j["norm_topk_prob"] = moe.router_topk > 1;  // Megatron's renormalisation (see the reader)
  j["routed_scaling_factor"] = moe.topk_scaling_factor > 0 ? moe.topk_scaling_factor : 1.0;
  j["n_group"] = moe.num_groups > 1 ? moe.num_groups : 1;
  j["topk_group"] = moe.num_groups > 1 ? moe.group_topk : 1;
}

void add_noaux_tc_router_mappings(const TransformerConfig& c, MoELayer& moe,
                                  const std::string& prefix, std::vector<HfTensorMapping>& maps) {
  add(maps, prefix + "gate.weight", moe.router.weight, {c.moe.num_experts, c.hidden_size});
  add(maps, prefix + "gate.e_score_correction_bias", moe.router.expert_bias, {c.moe.num_experts});
}

void read_deepseek_v3_config(const json& j, const std::string& file, TransformerConfig& c) {
  c.num_layers = hf_get<int64_t>(j, "num_hidden_layers", file);
  c.hidden_size = hf_get<int64_t>(j, "hidden_size", file);
  c.num_attention_heads = hf_get<int64_t>(j, "num_attention_heads", file);
  MEGATRON_CHECK(hf_get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, file) ==
                     c.num_attention_heads,
                 file,
                 ": num_key_value_heads must equal num_attention_heads (MLA has a key and "
                 "value per head)");
  c.ffn_hidden_size = hf_get<int64_t>(j, "intermediate_size", file);
  c.max_position_embeddings = hf_get<int64_t>(j, "max_position_embeddings", file);
  c.vocab_size = hf_get<int64_t>(j, "vocab_size", file);
  c.norm_epsilon = hf_get_or<double>(j, "rms_norm_eps", 1e-6, file);
  c.rotary_base = hf_get_or<double>(j, "rope_theta", 10000.0, file);
  const std::string act = hf_get_or<std::string>(j, "hidden_act", "silu", file);
  MEGATRON_CHECK(act == "silu", file, ": hidden_act '", act, "' is not supported (silu)");
  MEGATRON_CHECK(!hf_get_or<bool>(j, "attention_bias", false, file), file,
                 ": attention_bias is not supported");
  MEGATRON_CHECK(hf_get_or<bool>(j, "rope_interleave", true, file), file,
                 ": rope_interleave false is not supported (Megatron's MLA turns de-interleaved "
                 "pairs, as DeepSeek-V3)");
  c.mtp_num_layers = hf_get_or<int64_t>(j, "num_nextn_predict_layers", 0, file);
  MEGATRON_CHECK(c.mtp_num_layers >= 0, file, ": num_nextn_predict_layers must be >= 0");
  c.normalization = Normalization::kRMSNorm;
  c.swiglu = true;
  c.position_embedding = PositionEmbedding::kRope;
  c.add_bias_linear = false;
  c.qk_layernorm = true;  // q_a_layernorm and kv_a_layernorm
  c.untie_embeddings_and_output_weights = !hf_get_or<bool>(j, "tie_word_embeddings", false, file);

  MlaConfig& m = c.mla;
  m.enabled = true;
  m.q_lora_rank = hf_get_or<int64_t>(j, "q_lora_rank", 0, file);
  m.kv_lora_rank = hf_get<int64_t>(j, "kv_lora_rank", file);
  m.qk_head_dim = hf_get<int64_t>(j, "qk_nope_head_dim", file);
  m.qk_pos_emb_head_dim = hf_get<int64_t>(j, "qk_rope_head_dim", file);
  m.v_head_dim = hf_get<int64_t>(j, "v_head_dim", file);
  m.yarn = false;
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    const std::string type =
        hf_get_or<std::string>(rs, "rope_type", hf_get_or<std::string>(rs, "type", "", file), file);
    MEGATRON_CHECK(type == "yarn", file, ": rope_scaling type '", type,
                   "' is not supported (yarn, or none)");
    MEGATRON_CHECK(
        hf_get_or<double>(rs, "original_max_position_embeddings", 4096, file) ==
                m.original_max_position_embeddings &&
            hf_get_or<double>(rs, "beta_fast", 32, file) == m.beta_fast &&
            hf_get_or<double>(rs, "beta_slow", 1, file) == m.beta_slow,
        file,
        ": rope_scaling yarn loads with Megatron's constants only (original_max_position_"
        "embeddings 4096, beta_fast 32, beta_slow 1)");
    m.yarn = true;
    m.rotary_scaling_factor = hf_get<double>(rs, "factor", file);
    m.mscale = hf_get_or<double>(rs, "mscale", 1.0, file);
    m.mscale_all_dim = hf_get_or<double>(rs, "mscale_all_dim", 0.0, file);
  }
  read_moe(j, file, c);
}

json deepseek_v3_config_json(const TransformerConfig& c) {
  const MlaConfig& m = c.mla;
  const MoeConfig& moe = c.moe;
  MEGATRON_CHECK(c.qk_layernorm,
                 "this model has no Hugging Face equivalent: DeepSeek-V3 normalises the latents "
                 "(--qk-layernorm)");
  // Plain RoPE exports as rope_scaling null: Hugging Face then scales the softmax by
  // 1/sqrt(head dim) and rotates every rotary channel.
  MEGATRON_CHECK(
      m.yarn || (MlaConfig::yarn_mscale(m.rotary_scaling_factor, m.mscale_all_dim) == 1.0 &&
                 c.rotary_percent == 1.0),
      "this model has no Hugging Face equivalent: with --rope-type rope DeepSeek-V3 "
      "has no softmax mscale (--rotary-scaling-factor with --mscale-all-dim) and "
      "rotates every rotary channel (--rotary-percent 1)");
  json j = {{"model_type", "deepseek_v3"},
            {"architectures", {"DeepseekV3ForCausalLM"}},
            {"num_hidden_layers", c.num_layers},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_hidden_size},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_attention_heads},
            {"max_position_embeddings", c.max_position_embeddings},
            {"vocab_size", c.vocab_size},
            {"rms_norm_eps", c.norm_epsilon},
            {"rope_theta", c.rotary_base},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
            {"attention_bias", false},
            {"rope_interleave", true},
            {"q_lora_rank", m.q_lora_rank > 0 ? json(m.q_lora_rank) : json(nullptr)},
            {"kv_lora_rank", m.kv_lora_rank},
            {"qk_nope_head_dim", m.qk_head_dim},
            {"qk_rope_head_dim", m.qk_pos_emb_head_dim},
            {"v_head_dim", m.v_head_dim},
            {"num_nextn_predict_layers", c.mtp_blocks()},
            {"rope_scaling", nullptr}};
  if (m.yarn) {
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", m.rotary_scaling_factor},
                         {"original_max_position_embeddings", m.original_max_position_embeddings},
                         {"beta_fast", m.beta_fast},
                         {"beta_slow", m.beta_slow},
                         {"mscale", m.mscale},
                         {"mscale_all_dim", m.mscale_all_dim}};
  }
  if (!moe.enabled()) {
    j["n_routed_experts"] = nullptr;
    return j;
  }
  // The dense layers must come first (first_k_dense_replace).
  int64_t dense = 0;
  while (dense < c.num_layers && !moe.is_moe_layer(dense)) ++dense;
  for (int64_t i = dense; i < c.num_layers; ++i) {
    MEGATRON_CHECK(moe.is_moe_layer(i),
                   "this MoE model has no Hugging Face equivalent: DeepSeek-V3's dense layers come "
                   "first (--moe-layer-freq ([0]*K+[1]*N))");
  }
  check_noaux_tc_router_exportable(moe, "DeepSeek-V3");
  MEGATRON_CHECK(!moe.shared_expert_gate,
                 "this MoE model has no Hugging Face equivalent: DeepSeek-V3's shared experts have "
                 "no gate (--moe-shared-expert-gate)");
  const int64_t shared = moe.shared_expert_intermediate_size;
  MEGATRON_CHECK(shared % moe.ffn_hidden_size == 0,
                 "this MoE model has no Hugging Face equivalent: DeepSeek-V3's shared experts are "
                 "whole experts (--moe-shared-expert-intermediate-size a multiple of "
                 "--moe-ffn-hidden-size)");
  write_noaux_tc_router(moe, j);
  j["moe_intermediate_size"] = moe.ffn_hidden_size;
  j["n_shared_experts"] = shared / moe.ffn_hidden_size;
  j["first_k_dense_replace"] = dense;
  j["moe_layer_freq"] = 1;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  return j;
}

std::vector<std::pair<std::string, std::string>> deepseek_mtp_copies(const TransformerConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int64_t k = 0; k < c.mtp_blocks(); ++k) {
    const std::string p = "model.layers." + std::to_string(c.num_layers + k) + ".";
    out.emplace_back(p + "embed_tokens.weight", "model.embed_tokens.weight");
    out.emplace_back(p + "shared_head.head.weight", c.untie_embeddings_and_output_weights
                                                        ? "lm_head.weight"
                                                        : "model.embed_tokens.weight");
  }
  return out;
}

void add_deepseek_attention_mappings(const TransformerConfig& c, TransformerLayer& L,
                                     const std::string& p, std::vector<HfTensorMapping>& maps) {
  const MlaConfig& m = c.mla;
  MlaProjections& a = *L.self_attention->mla;
  const int64_t h = c.hidden_size, np = c.num_attention_heads;
  const std::string s = p + "self_attn.";
  if (a.linear_q_down_proj) {
    add(maps, s + "q_a_proj.weight", a.linear_q_down_proj->weight, {m.q_lora_rank, h});
    MEGATRON_CHECK(a.q_layernorm.has_value(),
                   "a DeepSeek-V3 layout needs --qk-layernorm (q_a_layernorm, kv_a_layernorm)");
    add(maps, s + "q_a_layernorm.weight", a.q_layernorm->weight, {m.q_lora_rank});
    add(maps, s + "q_b_proj.weight", a.linear_q_up_proj->weight(),
        {np * m.q_head_dim(), m.q_lora_rank});
  } else {
    add(maps, s + "q_proj.weight", a.linear_q_proj->weight(), {np * m.q_head_dim(), h});
  }
  add(maps, s + "kv_a_proj_with_mqa.weight", a.linear_kv_down_proj.weight,
      {m.kv_lora_rank + m.qk_pos_emb_head_dim, h});
  MEGATRON_CHECK(a.kv_layernorm.has_value(),
                 "a DeepSeek-V3 layout needs --qk-layernorm (q_a_layernorm, kv_a_layernorm)");
  add(maps, s + "kv_a_layernorm.weight", a.kv_layernorm->weight, {m.kv_lora_rank});
  add(maps, s + "kv_b_proj.weight", a.linear_kv_up_proj.weight(),
      {np * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank});
  add(maps, s + "o_proj.weight", L.self_attention->linear_proj.weight(), {h, np * m.v_head_dim});
}

void add_deepseek_moe_mappings(const TransformerConfig& c, TransformerLayer& L,
                               const std::string& p, std::vector<HfTensorMapping>& maps) {
  MoELayer& moe = *L.moe;
  const int64_t h = c.hidden_size, fe = c.moe.ffn_hidden_size;
  const std::string x = p + "mlp.";
  add_noaux_tc_router_mappings(c, moe, x, maps);
  for (int64_t e = 0; e < moe.experts.num_local(); ++e) {
    const std::string n = x + "experts." + std::to_string(moe.experts.first_expert() + e) + ".";
    add(maps, n + "gate_proj.weight", moe.experts.fc1(e), {fe, h}, 0);
    add(maps, n + "up_proj.weight", moe.experts.fc1(e), {fe, h}, fe);
    add(maps, n + "down_proj.weight", moe.experts.fc2(e), {h, fe});
  }
  if (moe.shared_experts) {
    const int64_t fs = c.moe.shared_expert_intermediate_size;
    add(maps, x + "shared_experts.gate_proj.weight", moe.shared_experts->linear_fc1.weight(),
        {fs, h}, 0);
    add(maps, x + "shared_experts.up_proj.weight", moe.shared_experts->linear_fc1.weight(), {fs, h},
        fs);
    add(maps, x + "shared_experts.down_proj.weight", moe.shared_experts->linear_fc2.weight(),
        {h, fs});
  }
}

}  // namespace megatron
