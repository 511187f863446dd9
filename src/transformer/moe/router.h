// TopKRouter: Megatron's MoE router on one rank's tokens: the gating GEMM logits = x W^T
// (W [E, h], replicated over TP), the routing of transformer/moe/routing.h, and the
// load-balancing losses, whose gradients it adds itself in backward (Megatron's
// MoEAuxLossAutoScaler: the losses join the objective with the weight the main loss's gradient
// carries, ForwardMode::aux_loss_scale, without changing the forward output).
//
// Parallelism: the input is this rank's tokens ([s/tp, b, h] under sequence parallelism, a
// context-parallel chunk under CP); the routing is per token, so nothing is communicated except
// the load-balancing counts, summed over TP x CP so that the aux loss is the one of the whole
// micro-batch (routing.h). W is marked sequence_parallel: its gradient is partial per TP rank.
//
// The router counts the tokens each expert gets in training (in backward, so that a recomputed
// forward counts once). Aux-loss-free balancing (--moe-router-enable-expert-bias) uses them: the
// trainer calls update_expert_bias once per global batch: bias_e += rate * sign(mean count -
// count_e), counts summed over TP x DP x CP. The bias is a frozen Param (no gradient, no decay,
// out of norms and counts) so that it is saved and resharded with the weights.
#pragma once

#include <string>
#include <vector>

#include "parallel/param.h"
#include "transformer/config.h"
#include "transformer/forward_mode.h"
#include "transformer/moe/aux_tracker.h"
#include "transformer/moe/routing.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class TopKRouter {
 public:
  struct Ctx {
    Tensor x;                    // [T, h] the GEMM's input (after jitter)
    Tensor jitter;               // [T, h] f32 noise, or undefined
    std::vector<double> logits;  // [T, E]
    moe::Routing routing;
    std::vector<double> dlogits_aux;  // [T, E] the load-balancing losses' gradient, or empty
    // Values for the tracker (loss / coeff), recorded in backward.
    std::vector<std::pair<std::string, double>> logged;
    MoeAuxTracker* tracker = nullptr;
    bool training = false;
  };

  TopKRouter(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
             const TensorParallelContext& tp);

  // x [T, h] (compute activations, f32) of `batch` sequences -> ctx.routing (probs and map).
  void forward(const Tensor& x, int64_t batch, Ctx& ctx, const ForwardMode& mode) const;
  // dprobs [T, E] (f64): gradient of the routing probabilities -> dx [T, h] f32 (the input's
  // gradient through the gating GEMM); accumulates W's gradient.
  Tensor backward(const std::vector<double>& dprobs, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

  // The tokens routed to each expert since the last update (training micro-batches), [E].
  const std::vector<double>& tokens_per_expert() const { return tokens_per_expert_; }
  void clear_tokens_per_expert() const;
  // Applies the aux-loss-free update with counts already summed over TP x DP x CP; no-op
  // without expert bias.
  void update_expert_bias(const std::vector<double>& global_counts);
  int64_t layer_number() const { return layer_; }
  bool has_expert_bias() const { return !expert_bias.name.empty(); }

  Param weight;  // [E, h]
  Param bias;    // [E], with --add-bias-linear (Megatron core 0.19's router bias); else unnamed
  Param expert_bias;  // [E] f32, only with --moe-router-enable-expert-bias

 private:
  // Row t of this rank's T tokens ([s', b] order of `batch` sequences) as its index in the whole
  // micro-batch (before sequence and context parallelism split it).
  int64_t global_token(int64_t t, int64_t T, int64_t batch) const;

  const TransformerConfig& cfg_;
  int64_t layer_;
  TensorParallelContext tp_;
  // Counted in backward (training only): const methods, state of the balancing statistics.
  mutable std::vector<double> tokens_per_expert_;
  // Forced balancing outside training: the forwards so far (each draws other logits).
  mutable uint64_t eval_draws_ = 0;
};

}  // namespace megatron
