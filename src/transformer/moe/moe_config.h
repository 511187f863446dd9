// MoeConfig: the Mixture-of-Experts part of a TransformerConfig, as Megatron's TransformerConfig
// holds it (the --moe-* flags). num_experts 0 is a dense model and every other field is ignored.
// Validated by validate(), which names the flag and the fix; not here: the parallel sizes (EP,
// ETP), which live in ParallelConfig and are checked against these by the CLI.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

enum class MoeScoreFunction : uint8_t { kSoftmax, kSigmoid };
enum class MoeLoadBalancing : uint8_t { kAuxLoss, kSeqAuxLoss, kSinkhorn, kNone };
enum class MoeDropPolicy : uint8_t { kProbs, kPosition };
enum class MoeDispatcher : uint8_t { kAllGather, kAllToAll };

struct MoeConfig {
  int64_t num_experts = 0;  // --num-experts (0: dense)
  // Per-expert FFN width, --moe-ffn-hidden-size (0: --ffn-hidden-size).
  int64_t ffn_hidden_size = 0;
  // Which layers are MoE: 1 at layer i (0-based) if MoE. From --moe-layer-freq (an int N: layer i
  // is MoE iff i % N == 0; or Megatron's list expression, e.g. "([0]*3+[1]*58)"); empty: all.
  std::vector<int> layer_pattern;
  // Total width of the shared experts, --moe-shared-expert-intermediate-size (0: none).
  int64_t shared_expert_intermediate_size = 0;
  bool shared_expert_overlap = false;  // --moe-shared-expert-overlap (alltoall only)
  // --moe-shared-expert-gate (Megatron core 0.19): the shared experts' output scaled per token by
  // sigmoid(x gate_weight); without shared experts it is ignored, as Megatron does.
  bool shared_expert_gate = false;
  // --moe-latent-size (Megatron core 0.19, Nemotron 3's LatentMoE; 0: none): the routed experts
  // run at this width between a projection down from the hidden size and one back up; the router
  // and the shared experts see the hidden size.
  int64_t latent_size = 0;

  int64_t router_topk = 2;                                       // --moe-router-topk
  MoeScoreFunction score_function = MoeScoreFunction::kSoftmax;  // --moe-router-score-function
  bool pre_softmax = false;                                      // --moe-router-pre-softmax
  double topk_scaling_factor = 0;   // --moe-router-topk-scaling-factor (0: none)
  int64_t num_groups = 0;           // --moe-router-num-groups (0: no group-limited routing)
  int64_t group_topk = 0;           // --moe-router-group-topk
  bool enable_expert_bias = false;  // --moe-router-enable-expert-bias (aux-loss-free balancing)
  double bias_update_rate = 1e-3;   // --moe-router-bias-update-rate
  // --moe-router-dtype fp32/fp64: the gating GEMM in that dtype (the routing math here is always
  // f64, finer than either). Empty: the compute dtype.
  std::string router_dtype;
  // --moe-router-load-balancing-type, one or more, each with its --moe-aux-loss-coeff.
  std::vector<MoeLoadBalancing> load_balancing = {MoeLoadBalancing::kAuxLoss};
  std::vector<double> aux_loss_coeff = {0.0};
  double z_loss_coeff = 0;      // --moe-z-loss-coeff (0: off)
  double input_jitter_eps = 0;  // --moe-input-jitter-eps (0: off)
  // --moe-router-force-load-balancing (Megatron's RandomSTE, for benchmarks): the routing sees
  // standard normal logits instead of the gating GEMM's, and their gradient goes to the GEMM as
  // if they were its output (a straight-through estimator).
  bool force_load_balancing = false;
  // --moe-apply-probs-on-input: y = expert(p x) instead of p expert(x) (top-1 only, Megatron's
  // assertion): the same for a linear expert, not through its activation.
  bool apply_probs_on_input = false;

  double capacity_factor = 0;  // --moe-expert-capacity-factor (<= 0: dropless)
  MoeDropPolicy drop_policy = MoeDropPolicy::kProbs;  // --moe-token-drop-policy
  bool pad_expert_input_to_capacity = false;          // --moe-pad-expert-input-to-capacity
  // --moe-router-padding-for-fp8 (alltoall dispatcher, FP8 only): each expert's tokens from this
  // rank are padded to a multiple of Fp8Config::align_size() (Megatron's get_fp8_align_size: 32
  // for mxfp8, else 16) with tokens routed to it with probability 0 (pad_routing_map), which add
  // nothing to the output but enter the FP8 GEMMs' amaxes.
  bool router_padding_for_fp8 = false;

  MoeDispatcher dispatcher = MoeDispatcher::kAllGather;  // --moe-token-dispatcher-type
  bool grouped_gemm = false;       // --moe-grouped-gemm (the experts' GEMMs are grouped either way)
  bool per_layer_logging = false;  // --moe-per-layer-logging

  bool enabled() const { return num_experts > 0; }
  // Layers past the pattern (multi-token prediction's) take the last layer's kind, as Megatron
  // builds them from the last decoder layer's spec.
  bool is_moe_layer(int64_t layer) const {
    if (!enabled() || layer_pattern.empty()) return enabled();
    const size_t i = std::min(static_cast<size_t>(layer), layer_pattern.size() - 1);
    return layer_pattern[i] != 0;
  }
  int64_t num_moe_layers(int64_t num_layers) const;
  bool dropless() const { return capacity_factor <= 0; }
  // The coefficient of a load-balancing type (0 when it is not among the types).
  double coeff_of(MoeLoadBalancing type) const;
  bool has(MoeLoadBalancing type) const;

  // Megatron's checks of validate_args and TransformerConfig that involve only these fields
  // (and the model's layer count).
  void validate(int64_t num_layers) const;
};

// --moe-layer-freq: "N" (every N-th layer from layer 0) or a list expression of 0/1 terms joined
// by '+', each "[a, b, ...]" optionally "*count", optionally in parentheses ("([0]*3+[1]*58)").
// Returns one entry per layer; errors name the flag.
std::vector<int> parse_moe_layer_freq(const std::string& text, int64_t num_layers);

// Names as Megatron spells them on the command line.
const char* moe_load_balancing_name(MoeLoadBalancing t);
MoeLoadBalancing parse_moe_load_balancing(const std::string& s);

}  // namespace megatron
