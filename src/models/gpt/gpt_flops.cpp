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
  return 12.0 * B * s * L * h * h * (attention + mlp + logit);
}

}  // namespace megatron
