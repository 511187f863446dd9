// Megatron's model-FLOPs formula (see gpt_flops.h for the derivation).
#include "models/gpt/gpt_flops.h"

namespace megatron {

double model_flops_per_iteration(const TransformerConfig& c, int64_t global_batch_size) {
  const double B = static_cast<double>(global_batch_size), s = static_cast<double>(c.seq_length);
  const double L = static_cast<double>(c.num_layers), h = static_cast<double>(c.hidden_size);
  const double n = static_cast<double>(c.num_attention_heads);
  const double g = static_cast<double>(c.num_query_groups);
  const double qproj_ratio = n * static_cast<double>(c.kv_channels) / h;
  const double gated = c.gated_mlp() ? 1.5 : 1.0;
  const double attention = (1.0 + g / n + s / h) * qproj_ratio;
  // MoE (Megatron's num_floating_point_operations): a dense layer's MLP, or the top-k routed
  // experts' and the shared experts' MLPs of an MoE layer (the router's GEMM is not counted).
  const double moe_layers = static_cast<double>(c.moe.num_moe_layers(c.num_layers));
  const double dense_layers = L - moe_layers;
  const double routed = static_cast<double>(c.moe.ffn_hidden_size * c.moe.router_topk) +
                        static_cast<double>(c.moe.shared_expert_intermediate_size);
  const double mlp =
      (static_cast<double>(c.ffn_hidden_size) * dense_layers / L + routed * moe_layers / L) / h *
      gated;
  const double logit = static_cast<double>(c.padded_vocab_size) / (2.0 * L * h);
  if (c.mla.enabled) {
    // Megatron's multi-latent attention term (r0.14's training.py), per token and layer: the
    // projections' parameters (the latent norms counted as one FMA per channel), linear_proj,
    // and the causal half of q . k over the query heads' width and of the values.
    const MlaConfig& m = c.mla;
    const double dq = static_cast<double>(m.q_head_dim()), dv = static_cast<double>(m.v_head_dim);
    const double q_term =
        m.q_lora_rank > 0 ? static_cast<double>(m.q_lora_rank) * (h + n * dq + 1) : h * n * dq;
    const double mla = q_term +
                       static_cast<double>(m.kv_lora_rank) *
                           (h + n * static_cast<double>(m.qk_head_dim + m.v_head_dim) + 1) +
                       h * static_cast<double>(m.qk_pos_emb_head_dim) + n * dv * h +
                       s * n * dq / 2 + s * n * dv / 2;
    return 12.0 * B * s * L * h * h * (mlp + logit) + 6.0 * B * s * L * mla;
  }
  return 12.0 * B * s * L * h * h * (attention + mlp + logit);
}

}  // namespace megatron
