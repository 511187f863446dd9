// Megatron's model-FLOPs formula (see gpt_flops.h for the derivation).
#include "models/gpt/gpt_flops.h"

namespace megatron {

namespace {

// A heterogeneous model's layers by their own kinds and sizes, in the formula's units: a whole
// attention with its query groups, a whole MLP with its width, a linear replacement's one h x h
// GEMM (1/2: the unit is 12 h^2 FLOPs per token over forward and backward, the GEMM 2 h^2 in each
// of its 3 passes, 6 h^2), a no-op nothing. (Megatron's
// formula does not read the block list: it counts every layer as the flags' whole layer.)
double heterogeneous_flops(const TransformerConfig& c, double B) {
  const double s = static_cast<double>(c.seq_length), h = static_cast<double>(c.hidden_size);
  const double n = static_cast<double>(c.num_attention_heads);
  const double qproj_ratio = n * static_cast<double>(c.kv_channels) / h;
  const double gated = c.gated_mlp() ? 1.5 : 1.0;
  double units = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const HeterogeneousBlock& b = *c.heterogeneous.block(l);
    const TransformerConfig lc = c.for_layer(l);
    if (b.attention == BranchKind::kWhole) {
      units += (1.0 + static_cast<double>(lc.num_query_groups) / n + s / h) * qproj_ratio;
    } else if (b.attention == BranchKind::kLinear) {
      units += 0.5;
    }
    if (b.mlp == BranchKind::kWhole) {
      units += static_cast<double>(lc.ffn_hidden_size) / h * gated;
    } else if (b.mlp == BranchKind::kLinear) {
      units += 0.5;
    }
  }
  const double logit = static_cast<double>(c.padded_vocab_size) / (2.0 * h);
  return 12.0 * B * s * h * h * (units + logit);
}

}  // namespace

double model_flops_per_iteration(const TransformerConfig& c, int64_t global_batch_size) {
  if (c.heterogeneous.enabled())
    return heterogeneous_flops(c, static_cast<double>(global_batch_size));
  const double B = static_cast<double>(global_batch_size), s = static_cast<double>(c.seq_length);
  const double L = static_cast<double>(c.num_layers), h = static_cast<double>(c.hidden_size);
  const double n = static_cast<double>(c.num_attention_heads);
  const double g = static_cast<double>(c.num_query_groups);
  const double qproj_ratio = n * static_cast<double>(c.kv_channels) / h;
  const double gated = c.gated_mlp() ? 1.5 : 1.0;
  // Multi-token prediction's layers count as layers of the last decoder layer's kind (r0.14).
  const double mtp = static_cast<double>(c.mtp_num_layers);
  const double layers = L + mtp;
  // Per token and layer, in units of 12 h^2 (forward, data grad, weight grad x GEMM pairs x
  // multiply-add).
  double attention = (1.0 + g / n + s / h) * qproj_ratio;
  // Core 0.19's --attention-output-gate: linear_qkv's gate rows, one more query projection's
  // worth of hidden x query GEMMs (half of the q + o unit above).
  if (c.attention_output_gate) attention += 0.5 * qproj_ratio;
  if (c.mla.enabled) {
    // Megatron's multi-latent attention term (r0.14's training.py): the projections' parameters
    // (the latent norms counted as one FMA per channel), linear_proj, and the causal half of
    // q . k over the query heads' width and of the values; 6 FLOPs per parameter and token.
    const MlaConfig& m = c.mla;
    const double dq = static_cast<double>(m.q_head_dim()), dv = static_cast<double>(m.v_head_dim);
    const double q_term =
        m.q_lora_rank > 0 ? static_cast<double>(m.q_lora_rank) * (h + n * dq + 1) : h * n * dq;
    const double mla = q_term +
                       static_cast<double>(m.kv_lora_rank) *
                           (h + n * static_cast<double>(m.qk_head_dim + m.v_head_dim) + 1) +
                       h * static_cast<double>(m.qk_pos_emb_head_dim) + n * dv * h +
                       s * n * dq / 2 + s * n * dv / 2;
    attention = 6.0 * mla / (12.0 * h * h);
  }
  // MoE (Megatron's num_floating_point_operations): a dense layer's MLP, or the top-k routed
  // experts' and the shared experts' MLPs of an MoE layer (the router's GEMM is not counted).
  const double last_moe = c.moe.is_moe_layer(c.num_layers - 1) ? 1.0 : 0.0;
  const double moe_layers =
      static_cast<double>(c.moe.num_moe_layers(c.num_layers)) + last_moe * mtp;
  const double dense_layers = layers - moe_layers;
  const double routed = static_cast<double>(c.moe.ffn_hidden_size * c.moe.router_topk) +
                        static_cast<double>(c.moe.shared_expert_intermediate_size);
  double mlp = (static_cast<double>(c.ffn_hidden_size) * dense_layers / layers +
                routed * moe_layers / layers) /
               h * gated;
  if (c.moe.latent_size > 0) {
    // Core 0.19's LatentMoE terms: the routed experts at the latent width, plus the two
    // projections between h and it (2 latent in Megatron's units, latent in these).
    const double latent = static_cast<double>(c.moe.latent_size);
    const double latent_routed =
        static_cast<double>(c.moe.ffn_hidden_size * c.moe.router_topk) * latent / h +
        static_cast<double>(c.moe.shared_expert_intermediate_size);
    mlp = (static_cast<double>(c.ffn_hidden_size) * dense_layers / layers +
           latent_routed * moe_layers / layers) /
              h * gated +
          latent * moe_layers / layers / h;
  }
  // MTP's two input norms, final norm and eh_proj per depth, and one more pass through the
  // output layer per depth.
  const double mtp_extra = 6.0 * mtp * (3.0 * h + 2.0 * h * h);
  // The output layer, once more per depth, as a share of the per-layer unit (the arrangement of
  // the formula before multi-token prediction: the same bits without it).
  const double logit = static_cast<double>(c.padded_vocab_size) * (mtp + 1.0) / (2.0 * layers * h);
  return 12.0 * B * s * layers * h * h * (attention + mlp + logit) + B * s * mtp_extra;
}

}  // namespace megatron
