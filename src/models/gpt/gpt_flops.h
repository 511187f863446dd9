// Model FLOPs per iteration, by Megatron's formula (num_floating_point_operations in
// megatron/training/training.py, from "Efficient Large-Scale Language Model Training on GPU
// Clusters", appendix): 12 * B * s * L * h^2 * ( (1 + g/n + s/h) * (n*hn/h)
//   + (ffn/h) * (3/2 if SwiGLU else 1) + Vp / (2 L h) ), with B the global batch. The factor 12 is
// 3 (forward, data grad, weight grad) x 2 (GEMMs come in pairs) x 2 (multiply-add). In an MoE
// layer the MLP term is that of the top-k experts plus the shared experts, (moe_ffn k + shared) /
// h, weighted by the share of MoE layers, as Megatron counts it. It counts full (not causal-halved)
// attention scores and no recomputation, so it is model FLOPs, the numerator of MFU. Multi-latent
// attention replaces the attention term by Megatron's MLA term (its projections' and linear_proj's
// parameters plus the causal half of the scores and values per token, as r0.14 writes it).
// Multi-token prediction adds its layers (of the last layer's kind), their norms and eh_proj,
// and one output layer per depth, as r0.14 counts them.
#pragma once

#include <cstdint>

#include "transformer/config.h"

namespace megatron {

double model_flops_per_iteration(const TransformerConfig& cfg, int64_t global_batch_size);

}  // namespace megatron
