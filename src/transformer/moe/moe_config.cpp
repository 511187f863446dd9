// MoeConfig checks (Megatron's validate_args and TransformerConfig.__post_init__ wording where it
// has one) and the --moe-layer-freq expression.
#include "transformer/moe/moe_config.h"

#include "core/error.h"
#include "transformer/layer_pattern.h"

namespace megatron {

int64_t MoeConfig::num_moe_layers(int64_t num_layers) const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
  return n;
}

double MoeConfig::coeff_of(MoeLoadBalancing type) const {
  for (size_t i = 0; i < load_balancing.size(); ++i)
    if (load_balancing[i] == type) return i < aux_loss_coeff.size() ? aux_loss_coeff[i] : 0.0;
  return 0.0;
}

bool MoeConfig::has(MoeLoadBalancing type) const {
  for (MoeLoadBalancing t : load_balancing)
    if (t == type) return true;
  return false;
}

void MoeConfig::validate(int64_t num_layers) const {
  MEGATRON_CHECK(latent_size == 0 || enabled(),
                 "MoE latent projections are applicable only for MoE models: "
                 "--moe-latent-size needs --num-experts");
  if (!enabled()) return;
  MEGATRON_CHECK(num_experts > 0, "--num-experts must be positive, got ", num_experts);
  MEGATRON_CHECK(layer_pattern.empty() || static_cast<int64_t>(layer_pattern.size()) == num_layers,
                 "--moe-layer-freq: the pattern has ", layer_pattern.size(),
                 " entries, --num-layers is ", num_layers, "; give one 0/1 per layer");
  MEGATRON_CHECK(num_moe_layers(num_layers) > 0,
                 "--moe-layer-freq makes no layer an MoE layer; give at least one 1, or drop "
                 "--num-experts for a dense model");
  MEGATRON_CHECK(ffn_hidden_size > 0, "--moe-ffn-hidden-size must be positive, got ",
                 ffn_hidden_size);
  MEGATRON_CHECK(router_topk >= 1 && router_topk <= num_experts, "--moe-router-topk (", router_topk,
                 ") must be between 1 and --num-experts (", num_experts, ")");
  MEGATRON_CHECK(shared_expert_intermediate_size >= 0,
                 "moe_shared_expert_intermediate_size must be num_shared_experts * "
                 "ffn_size_of_each_shared_expert, but got ",
                 shared_expert_intermediate_size);
  MEGATRON_CHECK(!shared_expert_overlap || dispatcher == MoeDispatcher::kAllToAll,
                 "moe_shared_expert_overlap only works with alltoall token dispatcher: add "
                 "--moe-token-dispatcher-type alltoall or drop --moe-shared-expert-overlap");
  MEGATRON_CHECK(!shared_expert_overlap || shared_expert_intermediate_size > 0,
                 "--moe-shared-expert-overlap needs --moe-shared-expert-intermediate-size");
  MEGATRON_CHECK(latent_size >= 0,
                 "MoE latent projection dimension has to be greater than zero: --moe-latent-size ",
                 latent_size);
  MEGATRON_CHECK(latent_size == 0 || !shared_expert_overlap,
                 "Shared expert overlap with MoE latent projections is not supported during "
                 "training. Disable moe_shared_expert_overlap: drop --moe-shared-expert-overlap");
  MEGATRON_CHECK(load_balancing.size() == aux_loss_coeff.size(),
                 "moe_aux_loss_coeff must be a list of the same length as "
                 "moe_router_load_balancing_type: --moe-router-load-balancing-type has ",
                 load_balancing.size(), " values, --moe-aux-loss-coeff ", aux_loss_coeff.size());
  for (double c : aux_loss_coeff)
    MEGATRON_CHECK(c >= 0, "--moe-aux-loss-coeff must be >= 0, got ", c);
  if (has(MoeLoadBalancing::kSinkhorn)) {
    MEGATRON_CHECK(load_balancing.size() == 1,
                   "--moe-router-load-balancing-type sinkhorn cannot be combined with other types");
    MEGATRON_CHECK(coeff_of(MoeLoadBalancing::kSinkhorn) == 0,
                   "Sinkhorn load balancing has no auxiliary loss: --moe-aux-loss-coeff must be 0 "
                   "with --moe-router-load-balancing-type sinkhorn, got ",
                   coeff_of(MoeLoadBalancing::kSinkhorn));
    MEGATRON_CHECK(dropless(),
                   "moe_expert_capacity_factor only works with aux_loss, seq_aux_loss or none "
                   "load balancing: drop --moe-expert-capacity-factor or choose another "
                   "--moe-router-load-balancing-type");
    MEGATRON_CHECK(!enable_expert_bias && num_groups == 0,
                   "--moe-router-load-balancing-type sinkhorn selects by its own scores: drop "
                   "--moe-router-enable-expert-bias and --moe-router-num-groups");
  }
  MEGATRON_CHECK(z_loss_coeff >= 0, "--moe-z-loss-coeff must be >= 0, got ", z_loss_coeff);
  MEGATRON_CHECK(!apply_probs_on_input || router_topk == 1,
                 "`moe_apply_probs_on_input` only works with `moe_router_topk`=1: "
                 "--moe-apply-probs-on-input needs --moe-router-topk 1, got ",
                 router_topk);
  MEGATRON_CHECK(input_jitter_eps >= 0 && input_jitter_eps < 1,
                 "--moe-input-jitter-eps must be in [0, 1), got ", input_jitter_eps);
  MEGATRON_CHECK(!enable_expert_bias || score_function == MoeScoreFunction::kSigmoid,
                 "Expert bias for aux-loss-free routing only supports sigmoid score function. "
                 "Please set --moe-router-score-function sigmoid for sigmoid score function.");
  MEGATRON_CHECK(bias_update_rate >= 0, "--moe-router-bias-update-rate must be >= 0, got ",
                 bias_update_rate);
  MEGATRON_CHECK(!(router_topk == 1 && score_function == MoeScoreFunction::kSoftmax &&
                   !pre_softmax && !has(MoeLoadBalancing::kSinkhorn)),
                 "Please use --moe-router-pre-softmax when topk is 1 (a softmax over one "
                 "selected logit is 1 and has no gradient)");
  if (group_topk > 0 || num_groups > 0) {
    MEGATRON_CHECK(num_groups > 0,
                   "When using group limited routing, moe_router_num_groups must be specified: "
                   "add --moe-router-num-groups");
    MEGATRON_CHECK(group_topk > 0, "--moe-router-num-groups needs --moe-router-group-topk");
    MEGATRON_CHECK(num_experts % num_groups == 0, "num_moe_experts (", num_experts,
                   ") should be divisible by moe_router_num_groups (", num_groups,
                   "): --num-experts by --moe-router-num-groups");
    MEGATRON_CHECK(group_topk <= num_groups, "moe_router_group_topk (", group_topk,
                   ") should be smaller than moe_router_num_groups (", num_groups, ")");
    MEGATRON_CHECK(router_topk <= group_topk * (num_experts / num_groups), "--moe-router-topk (",
                   router_topk, ") exceeds the experts of the --moe-router-group-topk (",
                   group_topk, ") groups a token may use (",
                   group_topk * (num_experts / num_groups), ")");
  }
  MEGATRON_CHECK(topk_scaling_factor >= 0,
                 "--moe-router-topk-scaling-factor must be positive, got ", topk_scaling_factor);
  MEGATRON_CHECK(router_dtype.empty() || router_dtype == "fp32" || router_dtype == "fp64",
                 "--moe-router-dtype: unknown '", router_dtype, "'; choose fp32 or fp64");
  MEGATRON_CHECK(!pad_expert_input_to_capacity || !dropless(),
                 "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
}

std::vector<int> parse_moe_layer_freq(const std::string& text, int64_t num_layers) {
  LayerFreq f = parse_layer_freq(text, num_layers, "--moe-layer-freq", "0 (dense) or 1 (MoE)");
  if (!f.pattern.empty()) return f.pattern;
  MEGATRON_CHECK(f.every >= 1, "--moe-layer-freq must be >= 1, got ", f.every);
  std::vector<int> out;
  for (int64_t i = 0; i < num_layers; ++i) out.push_back(i % f.every == 0 ? 1 : 0);
  return out;
}

const char* moe_load_balancing_name(MoeLoadBalancing t) {
  switch (t) {
    case MoeLoadBalancing::kAuxLoss:
      return "aux_loss";
    case MoeLoadBalancing::kSeqAuxLoss:
      return "seq_aux_loss";
    case MoeLoadBalancing::kSinkhorn:
      return "sinkhorn";
    case MoeLoadBalancing::kNone:
      return "none";
  }
  return "?";
}

MoeLoadBalancing parse_moe_load_balancing(const std::string& s) {
  for (MoeLoadBalancing t : {MoeLoadBalancing::kAuxLoss, MoeLoadBalancing::kSeqAuxLoss,
                             MoeLoadBalancing::kSinkhorn, MoeLoadBalancing::kNone})
    if (s == moe_load_balancing_name(t)) return t;
  MEGATRON_CHECK(false, "--moe-router-load-balancing-type: unknown '", s,
                 "'; choose aux_loss, seq_aux_loss, sinkhorn or none");
  return MoeLoadBalancing::kNone;
}

}  // namespace megatron
