// NVIDIA's Llama-Nemotron ("nemotron-nas", Hugging Face's DeciLMForCausalLM) as a heterogeneous
// GPT model (transformer/heterogeneous_config.h): Llama's keys and tensors, plus a block list
// whose layers have their own query groups and MLP widths, linear replacements
// (self_attn.linear_attn, mlp.linear_mlp: one [h, h] weight each) or no-op branches (no norm and
// no tensors). Megatron reads the same config.json for --heterogeneous-layers-config-path.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "transformer/config.h"

namespace megatron {

// After Llama's keys are in c: the block list, and the model-level sizes Megatron derives from
// it (query groups from the first n_heads_in_group, the MLP width of the first whole MLP).
// Variants that change the layers beyond that are refused by key (see heterogeneous_config.h).
void read_nemotron_nas_config(const nlohmann::json& j, const std::string& file,
                              TransformerConfig& c);

// The config.json keys of a heterogeneous model on top of Llama's (j): model_type, architectures
// and block_configs as the model was given them (its kept config.json's list, so that an import
// exports its own list back).
void add_nemotron_nas_keys(const TransformerConfig& c, nlohmann::json& j);

}  // namespace megatron
