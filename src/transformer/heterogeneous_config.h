// HeterogeneousConfig: a transformer whose layers differ (Megatron's
// HeterogeneousTransformerConfig, --heterogeneous-layers-config-path; NVIDIA's Llama-Nemotron
// "nemotron-nas" models, Hugging Face's DeciLMForCausalLM).
//
// The description is a Hugging Face config.json with a "block_configs" list, one entry per layer:
//
//   {"attention": {"no_op": false, "replace_with_linear": false, "n_heads_in_group": 8},
//    "ffn":       {"no_op": false, "replace_with_linear": false, "ffn_mult": 2.625}}
//
// Each branch is whole (with its own query groups or MLP width), replaced by one linear layer
// hidden -> hidden after its norm (Megatron's ColumnParallelLinearGathered), or a no-op (no norm,
// nothing added to the residual stream). Megatron's reading, kept here: the groups are
// num_attention_heads / n_heads_in_group (or "num_query_groups"; newer DeciLM lists'
// "num_key_value_heads"), the MLP width
// find_multiple(int(2 ffn_mult hidden / 3), 256) (or "ffn_hidden_size", or DeciLM's
// "intermediate_size"), the MLP entry is "ffn"
// or "mlp", and a null size means the model's own. The JSON text itself is kept (checkpoints
// store it, as Megatron's --heterogeneous-layers-config-encoded-json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

enum class BranchKind : uint8_t { kWhole, kLinear, kNoOp };

struct HeterogeneousBlock {
  BranchKind attention = BranchKind::kWhole;
  BranchKind mlp = BranchKind::kWhole;
  int64_t num_query_groups = 0;  // 0: the model's --num-query-groups
  int64_t ffn_hidden_size = 0;   // 0: the model's --ffn-hidden-size
};

struct HeterogeneousConfig {
  std::string json;  // the config.json text the blocks were read from
  std::vector<HeterogeneousBlock> blocks;

  bool enabled() const { return !blocks.empty(); }
  // Layer `layer`'s block (0-based); null when not heterogeneous or past the list (MTP layers).
  const HeterogeneousBlock* block(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(blocks.size())
               ? &blocks[static_cast<size_t>(layer)]
               : nullptr;
  }
};

// Megatron's MLPConfig.ffn_mult_to_intermediate_size: int(2 ffn_mult hidden / 3) rounded up to a
// multiple of 256.
int64_t ffn_mult_to_intermediate_size(double ffn_mult, int64_t hidden_size);

// Reads the block list of a config.json text. `source` names where the text came from (the flag
// or file) in errors; keys Megatron's model would silently drop but that change a Llama-Nemotron
// layer (sliding windows, sinks, sparsity, Mamba or MoE blocks, another activation) are refused
// by name.
HeterogeneousConfig parse_heterogeneous_config(const std::string& json_text,
                                               int64_t num_attention_heads, int64_t hidden_size,
                                               const std::string& source);

// Megatron's validate_model_config_args_from_heterogeneous_config: the config.json's model-level
// values that the flags must repeat (tie_word_embeddings false and no rope scaling when absent).
struct HeterogeneousModelArgs {
  std::string hidden_act;
  int64_t num_hidden_layers = 0, hidden_size = 0, num_attention_heads = 0;
  bool tie_word_embeddings = false;
  double rope_theta = 0, rope_scaling_factor = 0;
  bool has_rope_scaling = false;
  // num_attention_heads / the first non-null n_heads_in_group (0: none given).
  int64_t num_query_groups = 0;
};
HeterogeneousModelArgs heterogeneous_model_args(const std::string& json_text,
                                                const std::string& source);

}  // namespace megatron
