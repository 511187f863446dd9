// MoELayer: Megatron's MoE layer in place of a layer's MLP: router, token dispatch, experts,
// combine, plus the shared experts (a dense MLP over every token, added to the routed output).
//
//   probs, map = router(x)                     on this rank's tokens [T, h]
//   y_t = sum_{e in map_t} probs_te expert_e(x_t)  (+ shared(x_t))
//
// Dispatch (Megatron's allgather dispatcher, over the ETP x EP group G): every rank of G gathers
// G's tokens, their probabilities and map; takes the rows routed to its local experts, in
// (expert, token) order; runs them through its experts (ETP-partial with expert tensor
// parallelism); scatter-adds the results back to the gathered token order; and reduce-scatters
// over G, which sums the other experts' outputs and the ETP partial sums and returns every rank
// its own tokens. Backward mirrors it: all-gather of the output gradient, the experts' backward,
// reduce-scatter of the input gradient and of the probabilities' gradient. With EP 1 and ETP =
// TP, G is the TP group and this is the dense MLP's sequence-parallel pattern; without any
// parallelism G has one rank and nothing is communicated.
//
// Parallel layout: the input is [s', b, h] as for the MLP (s' = s/tp under sequence
// parallelism, which MoE needs with TP > 1 as Megatron).
//
// --moe-shared-expert-gate (Megatron core 0.19; Qwen2-MoE's shared_expert_gate): the shared
// experts' output is scaled per token by sigmoid(x w), w [1, h] (gate_weight), replicated over TP
// (a TP-partial gradient under sequence parallelism, as Megatron marks it sequence_parallel).
//
// --moe-token-dispatcher-type alltoall moves only the routed rows instead (AllToAllPlan: an
// all-to-all over EP with uneven splits, an all-gather over ETP), the same numbers up to the
// order of the sums.
//
// LatentMoE (--moe-latent-size L, Megatron core 0.19's MoELayer with moe_latent_size): the router
// and the shared experts take x; the routed tokens are fc1_latent_proj(x) [T, L], dispatched,
// run through experts of width L and combined at width L, then fc2_latent_proj brings the sum
// back to h. The two projections are replicated over TP (Megatron's "duplicated" TELinear; under
// sequence parallelism their weight gradients are TP-partial, Param::sequence_parallel) and run
// in FP8 under --fp8-format like the experts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/linear.h"
#include "transformer/mlp.h"
#include "transformer/moe/alltoall_dispatcher.h"
#include "transformer/moe/experts.h"
#include "transformer/moe/router.h"

namespace megatron {

class MoELayer {
  // The routed experts' config (hidden size L with LatentMoE), before `experts` which keeps a
  // reference to it.
  TransformerConfig experts_cfg_;

 public:
  struct Ctx {
    TopKRouter::Ctx router;
    GroupedExperts::Ctx experts;
    MLP::Ctx shared;
    std::vector<int64_t> rows;         // [N] gathered-token index of each permuted row
    Tensor index;                      // the same as an i64 tensor
    std::vector<int64_t> experts_of;   // [N] local expert of each permuted row
    int64_t tokens = 0, gathered = 0;  // T local, G x T gathered
    Shape in_shape;
    AllToAllPlan plan;                  // alltoall dispatcher
    Linear::Ctx latent_in, latent_out;  // LatentMoE's projections
    Linear::Ctx gate;                   // --moe-shared-expert-gate: its logits' GEMM
    Tensor shared_out, gate_score;      // the shared experts' output [T, h] and sigmoid [T]
  };

  MoELayer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
           const TensorParallelContext& tp);
  // `experts` and the MLPs keep references into this object's configs: not movable.
  MoELayer(MoELayer&&) = delete;
  MoELayer& operator=(MoELayer&&) = delete;

  Tensor forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const;  // [s', b, h]
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

  TopKRouter router;
  GroupedExperts experts;
  std::unique_ptr<MLP> shared_experts;  // with --moe-shared-expert-intermediate-size
  std::unique_ptr<Linear> fc1_latent_proj, fc2_latent_proj;  // with --moe-latent-size
  std::unique_ptr<Linear> shared_expert_gate;  // with --moe-shared-expert-gate (and shared experts)

 private:
  ProcessGroup& dispatch_group() const { return *tp_.expert.tp_ep; }
  Tensor forward_alltoall(const Tensor& flat, Ctx& ctx) const;
  // The routed experts' part: rows [T, width] in, their combined output [T, width] out (width: h,
  // or L with LatentMoE), by the all-gather or the alltoall dispatcher; the backwards return the
  // rows' gradient and leave the probabilities' gradient in dprobs [T, E].
  Tensor backward_alltoall(const Tensor& drows, Ctx& ctx, std::vector<double>& dprobs) const;
  Tensor routed_forward(const Tensor& rows, Ctx& ctx) const;
  Tensor routed_backward(const Tensor& drows, Ctx& ctx, std::vector<double>& dprobs) const;
  // The shared experts' part of the output (gated with --moe-shared-expert-gate) and its backward,
  // which returns the input's gradient through the shared experts and the gate.
  Tensor shared_forward(const Tensor& x, Ctx& ctx) const;
  Tensor shared_backward(const Tensor& dy, Ctx& ctx) const;

  TransformerConfig shared_cfg_;  // cfg with the shared experts' width (MLP keeps a reference)
  const TransformerConfig& cfg_;
  TensorParallelContext tp_;
  std::shared_ptr<ProcessGroup> self_;  // the EP group when there is none (EP 1)
};

}  // namespace megatron
