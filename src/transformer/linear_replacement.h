// LinearReplacement: a heterogeneous layer's attention or MLP replaced by one linear layer
// hidden -> hidden (Megatron's ColumnParallelLinearGathered; Llama-Nemotron's "replace_with_linear"
// blocks, Hugging Face's self_attn.linear_attn and mlp.linear_mlp).
//
// Column parallel: each TP rank computes hidden/tp output features and the output is gathered
// whole. Under sequence parallelism the input arrives as [s/tp, b, h] (gathered on dim 0 by the
// column layer) and the output leaves as this rank's [s/tp, b, h]: Megatron zero-pads each rank's
// columns and reduce-scatters on dim 0, which is the gathered output's rows of this rank, as here.
// Initialised N(0, init_method_std) (Megatron's config.init_method); a bias with
// add_bias_linear.
#pragma once

#include <string>
#include <vector>

#include "parallel/tensor_parallel_linear.h"
#include "transformer/config.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class LinearReplacement {
 public:
  using Ctx = ColumnParallelLinear::Ctx;

  // Its Params are `name`.weight [h, h] (and `name`.bias).
  LinearReplacement(const std::string& name, const TransformerConfig& cfg,
                    const TensorParallelContext& tp);

  Tensor forward(const Tensor& x, Ctx& ctx) const;  // [s', b, h] -> [s', b, h]
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out) { linear.collect(out); }
  DType gemm_input_dtype() const { return linear.gemm_input_dtype(); }

  ColumnParallelLinear linear;

 private:
  TensorParallelContext tp_;
};

}  // namespace megatron
