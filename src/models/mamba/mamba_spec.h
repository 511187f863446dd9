// The hybrid Mamba model's ModelSpec: `--model mamba`, `megatron pretrain_mamba`.
//
// Megatron's MambaModel is GPTModel's shape with its decoder replaced by a MambaStack: the same
// embedding (positions by --position-embedding-type, none in Megatron's examples), output layer,
// loss and data; the stack's layers are Mamba-2, attention-only and MLP-only layers as
// --hybrid-override-pattern or the --hybrid-*-ratio flags allocate them (transformer/mamba). Here
// the model is GPTModel itself with those layers (TransformerLayer's hybrid branches), so every
// GPT feature that does not depend on whole layers carries over: tensor, sequence, pipeline (any
// split, virtual stages too) and data parallelism, the distributed optimizer, recomputation,
// bf16/fp16, FP8 projections, checkpoints and generation. Hugging Face's form is NemotronH
// (models/mamba/mamba_hf.h).
#pragma once

#include "models/model_spec.h"

namespace megatron {

const ModelSpec& mamba_spec();

// Megatron's hybrid model FLOPs of one iteration (num_floating_point_operations' hybrid_flops):
// per layer type, forward x 3, with the Mamba layer's in/out projections and 7 d_inner state
// FLOPs per token for the scan, the attention layer's projections and s/2 score term, the MLP
// layer's two GEMMs, the MoE layer's top-k routed and shared experts' GEMMs (core 0.16's
// moe_layer_flops), and the logits.
double hybrid_flops_per_iteration(const TransformerConfig& cfg, int64_t global_batch_size);

}  // namespace megatron
