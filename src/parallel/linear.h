// Linear: y = x A^T + b, with A stored [out, in] as Megatron stores it.
//
// In bf16 runs the weight is bf16 and the input is rounded to bf16 before the GEMM; products
// accumulate in f32 and y is f32 (so is everything outside GEMMs). The weight gradient is
// accumulated straight into the fp32 main_grad by the GEMM (beta = 1), Megatron's
// gradient-accumulation fusion. Tensor parallelism (Column/RowParallelLinear) builds on this.
#pragma once

#include <string>

#include "parallel/param.h"

namespace megatron {

class Linear {
 public:
  struct Ctx {
    Tensor x;  // input as the GEMM saw it (f32, or bf16 in bf16 runs)
  };

  Linear(const std::string& name, int64_t in, int64_t out, bool with_bias, double init_std);

  // x [rows, in] f32 -> y [rows, out] f32.
  Tensor forward(const Tensor& x, Ctx& ctx) const;
  // dy [rows, out] -> dx [rows, in]; weight.main_grad += dy^T x, bias.main_grad += sum dy.
  Tensor backward(const Tensor& dy, Ctx& ctx) const;

  void collect(std::vector<Param*>& out);
  Param weight;
  Param bias;  // empty name when there is no bias
  bool has_bias() const { return !bias.name.empty(); }

 private:
  int64_t in_, out_;
};

}  // namespace megatron
