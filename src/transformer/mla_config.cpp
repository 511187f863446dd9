// MlaConfig's YaRN scales and checks.
#include "transformer/mla_config.h"

#include <cmath>

#include "core/error.h"

namespace megatron {

double MlaConfig::yarn_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

double MlaConfig::softmax_scale() const {
  const double m = yarn_mscale(rotary_scaling_factor, mscale_all_dim);
  return m * m / std::sqrt(static_cast<double>(q_head_dim()));
}

double MlaConfig::rope_mscale() const {
  if (!yarn) return 1.0;
  return yarn_mscale(rotary_scaling_factor, mscale) /
         yarn_mscale(rotary_scaling_factor, mscale_all_dim);
}

void MlaConfig::validate() const {
  if (!enabled) return;
  MEGATRON_CHECK(q_lora_rank >= 0, "--q-lora-rank must be positive (or unset), got ", q_lora_rank);
  MEGATRON_CHECK(kv_lora_rank > 0, "--kv-lora-rank must be positive, got ", kv_lora_rank);
  MEGATRON_CHECK(qk_head_dim > 0, "--qk-head-dim must be positive, got ", qk_head_dim);
  MEGATRON_CHECK(qk_pos_emb_head_dim >= 2 && qk_pos_emb_head_dim % 2 == 0,
                 "--qk-pos-emb-head-dim must be even and >= 2 (its channels turn in pairs), got ",
                 qk_pos_emb_head_dim);
  MEGATRON_CHECK(v_head_dim > 0, "--v-head-dim must be positive, got ", v_head_dim);
  MEGATRON_CHECK(rotary_scaling_factor > 0, "--rotary-scaling-factor must be positive, got ",
                 rotary_scaling_factor);
}

}  // namespace megatron
