// Llama-Nemotron's config.json: its block list in and out.
#include "models/gpt/nemotron_nas_hf.h"

#include "core/error.h"

namespace megatron {

void read_nemotron_nas_config(const nlohmann::json& j, const std::string& file,
                              TransformerConfig& c) {
  MEGATRON_CHECK(!j.contains("position_embedding_type") || j["position_embedding_type"].is_null() ||
                     j["position_embedding_type"] == "rope",
                 file, ": position_embedding_type ", j.value("position_embedding_type", nlohmann::json()).dump(),
                 " is not implemented (rope: Llama's half-split rotation)");
  MEGATRON_CHECK(!j.value("o_proj_bias", false), file, ": o_proj_bias is not supported");
  c.heterogeneous = parse_heterogeneous_config(j.dump(), c.num_attention_heads, c.hidden_size, file);
  // Megatron's --num-query-groups for these models: heads / the first n_heads_in_group.
  int64_t groups = 0, ffn = 0;
  for (const HeterogeneousBlock& b : c.heterogeneous.blocks) {
    if (groups == 0 && b.num_query_groups > 0) groups = b.num_query_groups;
    if (ffn == 0 && b.ffn_hidden_size > 0) ffn = b.ffn_hidden_size;
  }
  c.num_query_groups = groups > 0 ? groups : c.num_attention_heads;
  if (c.ffn_hidden_size == 0) c.ffn_hidden_size = ffn;
}

void add_nemotron_nas_keys(const TransformerConfig& c, nlohmann::json& j) {
  // The block list as given (heterogeneous.json always holds the text it was read from).
  const nlohmann::json kept = nlohmann::json::parse(c.heterogeneous.json);
  j["model_type"] = "nemotron-nas";
  j["architectures"] = {"DeciLMForCausalLM"};
  j["block_configs"] = kept.at("block_configs");
  j.erase("num_key_value_heads");
  j.erase("intermediate_size");
  j["mlp_bias"] = false;
  // The remote code Hugging Face loads these models with, when the source config named it.
  if (kept.contains("auto_map")) j["auto_map"] = kept["auto_map"];
}

}  // namespace megatron
