// MambaConfig: the shape of a hybrid Mamba model's layers (Megatron's MambaModel: --hybrid-*,
// --mamba-* flags, megatron/core/ssm).
//
// A hybrid stack is one symbol per layer: 'M' a Mamba-2 layer (norm, MambaMixer, residual add),
// '*' an attention-only layer (input norm, self-attention, residual add), '-' an MLP-only layer
// (pre-MLP norm, MLP, residual add), 'E' an MoE-only layer (pre-MLP norm, the MoE layer of
// --num-experts, residual add; Megatron core 0.16's MoE symbol, Nemotron-H's MoE variants).
// Megatron builds the list from --hybrid-attention-ratio and --hybrid-mlp-ratio (allocate_layers
// below, its algorithm; never E) or takes --hybrid-layer-pattern (--hybrid-override-pattern).
//
// The mixer's sizes (Megatron's MambaMixer with expand 2, d_conv 4): d_inner = heads x head_dim
// channels (heads: --mamba-num-heads, or 2 hidden / head_dim), B and C of `groups` x state_dim
// each, one dt per head; the in-projection computes [z | x | B | C | dt].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

struct MambaConfig {
  // One symbol per decoder layer ('M', '*', '-', 'E'); empty: not a hybrid model (every layer is a
  // whole transformer layer).
  std::string layers;
  // One multi-token prediction depth's layers (the unified pattern's "/<mtp>", hybrid_pattern.h);
  // empty: no MTP. Depth k's layer j has the global layer number
  // layers.size() + k * mtp_layers.size() + j (after the decoder's, as GPT's MTP layer).
  std::string mtp_layers;
  int64_t state_dim = 128;  // --mamba-state-dim
  int64_t head_dim = 64;    // --mamba-head-dim
  int64_t num_groups = 8;   // --mamba-num-groups
  int64_t num_heads = 0;    // --mamba-num-heads (0: expand x hidden / head_dim)
  int64_t expand = 2;       // Megatron's MambaMixer default (no flag)
  int64_t d_conv = 4;       // the causal convolution's width (no flag)

  bool enabled() const { return !layers.empty(); }
  // Layer `layer`'s symbol ('M', '*', '-' or 'E'), an MTP layer's past the decoder's; 0 when not
  // hybrid or past the pattern without MTP layers (a whole transformer layer).
  char layer_type(int64_t layer) const {
    const auto n = static_cast<int64_t>(layers.size());
    if (layer >= 0 && layer < n) return layers[static_cast<size_t>(layer)];
    if (layer < n || mtp_layers.empty()) return '\0';
    return mtp_layers[static_cast<size_t>((layer - n) % static_cast<int64_t>(mtp_layers.size()))];
  }
  bool has_mamba() const {
    return layers.find('M') != std::string::npos || mtp_layers.find('M') != std::string::npos;
  }

  int64_t heads(int64_t hidden) const {
    return num_heads > 0 ? num_heads : expand * hidden / head_dim;
  }
  int64_t d_inner(int64_t hidden) const { return heads(hidden) * head_dim; }
  // Channels of the causal convolution: x, B and C.
  int64_t conv_dim(int64_t hidden) const { return d_inner(hidden) + 2 * num_groups * state_dim; }
  // The in-projection's outputs: z, x, B, C and dt.
  int64_t in_proj_dim(int64_t hidden) const {
    return 2 * d_inner(hidden) + 2 * num_groups * state_dim + heads(hidden);
  }

  // Checks the sizes against the layer count, the hidden size and the TP size; errors name the
  // flags (Megatron's MambaMixer assertions).
  void validate(int64_t num_layers, int64_t hidden, int64_t tp) const;
};

// Megatron's allocate_layers (megatron/core/ssm/mamba_hybrid_layer_allocation.py): the layer
// symbols of `num_layers` layers for the attention and MLP ratios, spread evenly between the
// Mamba layers; `override_pattern` (non-empty) replaces them, and must then hold as many of
// each symbol when a ratio is positive. Errors name the flags.
// `flag` names the pattern's flag in errors.
std::string allocate_hybrid_layers(int64_t num_layers, double attention_ratio, double mlp_ratio,
                                   const std::string& override_pattern,
                                   const std::string& flag = "--hybrid-layer-pattern");

}  // namespace megatron
