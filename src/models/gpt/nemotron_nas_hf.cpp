// Llama-Nemotron's config.json: its block list in and out.
#include "models/gpt/nemotron_nas_hf.h"

#include "core/error.h"

namespace megatron {

void read_nemotron_nas_config(const nlohmann::json& j, const std::string& file,
                              TransformerConfig& c) {
  MEGATRON_CHECK(!j.contains("position_embedding_type") || j["position_embedding_type"].is_null() ||
                     j["position_embedding_type"] == "rope",
                 file, ": position_embedding_type ",
                 j.value("position_embedding_type", nlohmann::json()).dump(),
                 " is not implemented (rope: Llama's half-split rotation)");
  MEGATRON_CHECK(!j.value("o_proj_bias", false), file, ": o_proj_bias is not supported");
  c.heterogeneous =
      parse_heterogeneous_config(j.dump(), c.num_attention_heads, c.hidden_size, file);
  // Megatron's --num-query-groups for these models: heads / the first n_heads_in_group.
  int64_t groups = 0, ffn = 0;
  for (const HeterogeneousBlock& b : c.heterogeneous.blocks) {
    if (groups == 0 && b.num_query_groups > 0) groups = b.num_query_groups;
    if (ffn == 0 && b.ffn_hidden_size > 0) ffn = b.ffn_hidden_size;
  }
  c.num_query_groups = groups > 0 ? groups : c.num_attention_heads;
  if (c.ffn_hidden_size == 0) c.ffn_hidden_size = ffn;
}

namespace {

// Whether a block list is written with Hugging Face DeciLM's keys only (its BlockConfig builds
// FFNConfig(**block["ffn"]): Megatron's own keys, or "mlp" for "ffn", would not load there).
bool in_decilm_keys(const nlohmann::json& blocks) {
  for (const nlohmann::json& b : blocks) {
    if (!b.contains("ffn") || b.contains("mlp")) return false;
    if (b["attention"].contains("num_query_groups") || b["ffn"].contains("ffn_hidden_size"))
      return false;
  }
  return true;
}

}  // namespace

void add_nemotron_nas_keys(const TransformerConfig& c, nlohmann::json& j) {
  // The block list as given when it is DeciLM's (heterogeneous.json always holds the text it was
  // read from), so that an import exports its own list back; else written in DeciLM's keys:
  // n_heads_in_group and ffn_mult (3 width / 2 hidden, which its rounding maps back to the width
  // when that is a multiple of 256, as every DeciLM width is).
  const nlohmann::json kept = nlohmann::json::parse(c.heterogeneous.json);
  nlohmann::json blocks = kept.at("block_configs");
  if (!in_decilm_keys(blocks)) {
    blocks = nlohmann::json::array();
    for (size_t i = 0; i < c.heterogeneous.blocks.size(); ++i) {
      const HeterogeneousBlock& b = c.heterogeneous.blocks[i];
      const TransformerConfig lc = c.for_layer(static_cast<int64_t>(i));
      const bool attention = b.attention == BranchKind::kWhole, mlp = b.mlp == BranchKind::kWhole;
      MEGATRON_CHECK(!mlp || lc.ffn_hidden_size % 256 == 0,
                     "this heterogeneous model has no Hugging Face nemotron-nas form: layer ", i,
                     "'s MLP width ", lc.ffn_hidden_size,
                     " is not a multiple of 256 (DeciLM's widths come from ffn_mult rounded up to "
                     "one)");
      const double mult =
          1.5 * static_cast<double>(lc.ffn_hidden_size) / static_cast<double>(c.hidden_size);
      blocks.push_back({{"attention",
                         {{"no_op", b.attention == BranchKind::kNoOp},
                          {"replace_with_linear", b.attention == BranchKind::kLinear},
                          {"n_heads_in_group",
                           attention ? nlohmann::json(c.num_attention_heads / lc.num_query_groups)
                                     : nlohmann::json()}}},
                        {"ffn",
                         {{"no_op", b.mlp == BranchKind::kNoOp},
                          {"replace_with_linear", b.mlp == BranchKind::kLinear},
                          {"ffn_mult", mlp ? nlohmann::json(mult) : nlohmann::json()}}}});
      MEGATRON_ASSERT(
          !mlp || ffn_mult_to_intermediate_size(mult, c.hidden_size) == lc.ffn_hidden_size,
          "ffn_mult ", mult, " does not give back width ", lc.ffn_hidden_size);
    }
  }
  MEGATRON_CHECK(!c.qk_layernorm && !c.add_qkv_bias,
                 "this heterogeneous model has no Hugging Face nemotron-nas form: DeciLM's "
                 "attention has no query/key norms or q/k/v biases (drop --qk-layernorm and "
                 "--add-qkv-bias)");
  j["model_type"] = "nemotron-nas";
  j["architectures"] = {"DeciLMForCausalLM"};
  j["block_configs"] = blocks;
  j.erase("num_key_value_heads");
  j.erase("intermediate_size");
  j["mlp_bias"] = false;
  // The remote code Hugging Face loads these models with, when the source config named it.
  if (kept.contains("auto_map")) j["auto_map"] = kept["auto_map"];
}

}  // namespace megatron
