// MLP: linear_fc1 -> activation -> linear_fc2.
//
// Activation: exact GELU (Megatron's default), tanh GELU (--openai-gelu), or SwiGLU (--swiglu),
// where fc1 is twice as wide and its output is [gate | up]. fc2 uses the scaled init
// std / sqrt(2 * num_layers), as Megatron's output projections do.
//
// Tensor parallelism: fc1 is column parallel (each rank computes ffn/tp of the features, for
// SwiGLU its slice of the gate and of the up projection), the activation is local, fc2 is row
// parallel and sums over the TP group. Under sequence parallelism the input and output are
// [s/tp, b, h].
#pragma once

#include <string>

#include "parallel/tensor_parallel_linear.h"
#include "transformer/config.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class MLP {
 public:
  struct Ctx {
    ColumnParallelLinear::Ctx fc1_ctx;
    RowParallelLinear::Ctx fc2_ctx;
    Tensor pre_act;  // fc1 output [s, b, ffn/tp or 2 ffn/tp]
    Tensor input;    // recompute(): the input, the only thing kept between forward and backward
  };

  MLP(const std::string& name, const TransformerConfig& cfg, const TensorParallelContext& tp);

  Tensor forward(const Tensor& x, Ctx& ctx) const;  // [s, b, h] -> [s, b, h]
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);
  // Selective recomputation of the whole MLP (--recompute-modules mlp, or shared_experts for an
  // MoE layer's): forward keeps only its input, backward runs the forward again first (the same
  // kernels on the same input, so the same bits).
  void set_recompute(bool on) { recompute_ = on; }
  // --recompute-modules layernorm: forget the input forward kept (the norm's output), and take
  // it back recomputed before backward.
  void drop_input(Ctx& ctx) const;
  void keep_input(const Tensor& x, Ctx& ctx) const;

  ColumnParallelLinear linear_fc1;
  RowParallelLinear linear_fc2;

 private:
  Tensor run(const Tensor& x, Ctx& ctx) const;  // the forward itself

  const TransformerConfig& cfg_;
  int64_t ffn_local_;  // ffn_hidden_size / tp
  bool recompute_ = false;
};

// The MLP's activation as cfg chooses it (SwiGLU on [gate | up], squared ReLU, or GELU): out =
// act(x), and its backward dx = act'(x) dout. Shared with the MoE experts.
void mlp_activation_forward(const TransformerConfig& cfg, Tensor& out, const Tensor& x);
void mlp_activation_backward(const TransformerConfig& cfg, Tensor& dx, const Tensor& dout,
                             const Tensor& x);

}  // namespace megatron
