// MLP: linear_fc1 -> activation -> linear_fc2.
//
// Activation: exact GELU (Megatron's default), tanh GELU (--openai-gelu), or SwiGLU (--swiglu),
// where fc1 is twice as wide and its output is [gate | up]. fc2 uses the scaled init
// std / sqrt(2 * num_layers), as Megatron's output projections do.
#pragma once

#include <string>

#include "transformer/config.h"
#include "transformer/linear.h"

namespace megatron {

class MLP {
 public:
  struct Ctx {
    Linear::Ctx fc1_ctx, fc2_ctx;
    Tensor pre_act;  // fc1 output [rows, ffn or 2 ffn]
  };

  MLP(const std::string& name, const TransformerConfig& cfg);

  Tensor forward(const Tensor& x, Ctx& ctx) const;  // [s, b, h] -> [s, b, h]
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

  Linear linear_fc1, linear_fc2;

 private:
  const TransformerConfig& cfg_;
};

}  // namespace megatron
