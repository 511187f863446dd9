// GroupedExperts: this rank's experts of one MoE layer, applied to tokens already grouped by
// expert (the dispatcher's permuted rows), Megatron's experts with the router probability applied
// after the activation (r0.12+):
//
//   y_r = fc2_e( act(fc1_e(x_r)) * p_r )   for row r routed to local expert e
//
// which equals p_r * expert_e(x_r) (with --add-bias-linear, gpt-oss's expert biases: fc1's bias
// before the activation, fc2's scaled by p_r, Megatron core 0.19's _apply_bias); or, with
// --moe-apply-probs-on-input (top-1 routing, Llama 4), y_r = expert_e(p_r x_r). fc1 is [ffn_e (x2
// for SwiGLU: [gate | up]), h], fc2 [h, ffn_e], per expert, as SequentialMLP's local_experts. Each
// expert's rows are one contiguous block; each of the six GEMMs (fc1 and fc2, their input and
// weight gradients) is one grouped GEMM over all local experts' blocks (ops::grouped_matmul,
// Megatron's --moe-grouped-gemm; the CPU device has no other kind, so the flag changes nothing
// here), and the activation and the probability scaling run once over all rows.
//
// Expert tensor parallelism (ETP): fc1 is split by output features and fc2 by input features over
// the ETP group, like a column- and a row-parallel linear, but without their collectives: the
// dispatcher's all-gather and reduce-scatter supply the input and sum the partial outputs (and
// partial input gradients and probability gradients). Params carry the ETP shard attributes.
//
// Names: decoder.layers.L.mlp.experts.local_experts.G.linear_fc{1,2}.weight with G the expert's
// global index, so a checkpoint holds each expert under one name in every EP layout (Megatron's
// SequentialMLP names at EP 1; its distributed checkpoint uses a global expert axis instead).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "parallel/linear.h"
#include "transformer/config.h"

namespace megatron {

class GroupedExperts {
 public:
  struct Ctx {
    Tensor x;                     // [N, h] the GEMM input (compute dtype)
    Tensor pre_act;               // [N, f1] fc1 output, f32
    Tensor act;                   // [N, f] activation (before the probabilities), f32
    Tensor scaled;                // [N, f] act * p, as fc2 saw it (compute dtype)
    std::vector<double> probs;    // [N]
    std::vector<int64_t> counts;  // rows per local expert
    // FP8: x and scaled quantised per expert block, with each block's inverse scale, and the
    // weights as the forward quantised them (block-scaled recipes: x and scaled quantised
    // columnwise for the weight gradients; the weights read again columnwise).
    Tensor x8, scaled8;  // [N, h], [N, f] FP8 values (x and scaled then kept only for
                         // high-precision weight gradients, --no-fp8-wgrad)
    std::vector<float> x_inv, scaled_inv;
    std::vector<Fp8Tensor> w1, w2;
    // --moe-apply-probs-on-input: the rows before their scaling, and the probabilities.
    Tensor unscaled_x;
    std::vector<double> input_probs;
  };

  // ep_rank, ep_size: this rank's share of the experts (num_experts / ep_size consecutive ones);
  // etp: the expert-tensor-parallel group (size 1: whole experts).
  GroupedExperts(const std::string& name, const TransformerConfig& cfg, int ep_rank, int ep_size,
                 ProcessGroup& etp);

  // x [N, h] rows grouped by local expert, counts[e] rows each (f32, or already in gemm_dtype());
  // probs [N]. Returns y [N, h] f32 (a partial sum over ETP ranks).
  Tensor forward(const Tensor& x, const std::vector<int64_t>& counts,
                 const std::vector<double>& probs, Ctx& ctx) const;
  // dy [N, h] -> dx [N, h] f32 and dprobs [N] (partial sums over ETP ranks); accumulates the
  // weights' gradients.
  Tensor backward(const Tensor& dy, Ctx& ctx, std::vector<double>* dprobs) const;
  void collect(std::vector<Param*>& out);
  // Runs the experts' GEMMs in FP8 (Transformer Engine's GroupedLinear: a scaling state per
  // expert GEMM, each expert's block of rows quantised with its own scale); returns the states.
  std::vector<Fp8GemmScaling*> enable_fp8(const Fp8Config& cfg);

  int64_t num_local() const { return static_cast<int64_t>(fc1_.size()); }
  int64_t first_expert() const { return first_; }
  Param& fc1(int64_t local) { return fc1_[local]->weight; }
  Param& fc2(int64_t local) { return fc2_[local]->weight; }
  // Their biases (--add-bias-linear; unnamed without).
  Param& fc1_bias(int64_t local) { return fc1_[local]->bias; }
  Param& fc2_bias(int64_t local) { return fc2_[local]->bias; }
  // The dtype of the experts' GEMM inputs, and t in it (f32 weights take t as it is): the
  // dispatcher converts tokens before moving them, so in bf16 they travel in half the bytes.
  DType gemm_dtype() const;
  Tensor gemm_input(const Tensor& t) const;

 private:
  // The experts on rows whose activations are scaled by `probs` (forward and backward above
  // without --moe-apply-probs-on-input's input scaling).
  Tensor forward_rows(const Tensor& x, const std::vector<int64_t>& counts,
                      const std::vector<double>& probs, Ctx& ctx) const;
  Tensor backward_rows(const Tensor& dy, Ctx& ctx, std::vector<double>* dprobs) const;
  Tensor forward_fp8(const Tensor& x, const std::vector<int64_t>& counts,
                     const std::vector<double>& probs, Ctx& ctx) const;
  Tensor backward_fp8(const Tensor& dy, Ctx& ctx, std::vector<double>* dprobs) const;
  // ctx.act = activation(ctx.pre_act) and ctx.scaled = act x probabilities (the GEMM input of
  // fc2): the forward's, and moe_act's recomputation of them.
  void activation(Ctx& ctx) const;
  // Every expert's weight of fc1_ or fc2_ for its GEMMs (Fp8GemmScaling::weight, or
  // weight_columnwise for a block-scaled recipe's input gradients).
  std::vector<Fp8Tensor> fp8_weights(const std::vector<std::unique_ptr<Linear>>& fc,
                                     Fp8Usage usage = Fp8Usage::kRowwise) const;

  const TransformerConfig& cfg_;
  bool fp8_ = false;
  bool recompute_act_ = false;  // --recompute-modules moe_act
  int etp_rank_ = 0, etp_size_ = 1;
  int64_t first_;      // global index of local expert 0
  int64_t ffn_local_;  // ffn_e / etp
  std::vector<std::unique_ptr<Linear>> fc1_, fc2_;
};

}  // namespace megatron
