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
// --moe-token-dispatcher-type alltoall moves only the routed rows instead (AllToAllPlan: an
// all-to-all over EP with uneven splits, an all-gather over ETP), the same numbers up to the
// order of the sums.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transformer/mlp.h"
#include "transformer/moe/alltoall_dispatcher.h"
#include "transformer/moe/experts.h"
#include "transformer/moe/router.h"

namespace megatron {

class MoELayer {
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
    AllToAllPlan plan;  // alltoall dispatcher
  };

  MoELayer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
           const TensorParallelContext& tp);

  Tensor forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const;  // [s', b, h]
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

  TopKRouter router;
  GroupedExperts experts;
  std::unique_ptr<MLP> shared_experts;  // with --moe-shared-expert-intermediate-size

 private:
  ProcessGroup& dispatch_group() const { return *tp_.expert.tp_ep; }
  Tensor forward_alltoall(const Tensor& flat, Ctx& ctx) const;
  Tensor backward_alltoall(const Tensor& dflat, Ctx& ctx) const;

  TransformerConfig shared_cfg_;  // cfg with the shared experts' width (MLP keeps a reference)
  const TransformerConfig& cfg_;
  TensorParallelContext tp_;
  std::shared_ptr<ProcessGroup> self_;  // the EP group when there is none (EP 1)
};

}  // namespace megatron
