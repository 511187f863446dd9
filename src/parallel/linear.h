// Linear: y = x A^T + b, with A stored [out, in] as Megatron stores it.
//
// In bf16 runs the weight is bf16 and the input is rounded to bf16 before the GEMM; products
// accumulate in f32 and y is f32 (so is everything outside GEMMs). The weight gradient is
// accumulated straight into the fp32 main_grad by the GEMM (beta = 1), Megatron's
// gradient-accumulation fusion. Tensor parallelism (Column/RowParallelLinear) builds on this.
//
// With FP8 enabled (enable_fp8), the three GEMMs take quantised operands instead
// (parallel/fp8_scaling.h): y = (q_x q_w^T) s_x^-1 s_w^-1, dx = (q_dy q_w) s_dy^-1 s_w^-1 and
// dA += (q_dy^T q_x) s_dy^-1 s_x^-1 (in high precision with --no-fp8-wgrad), the FP8 values held
// in bf16 and multiplied by the bf16 GEMM (exact products, f32 sums, as an FP8 tensor core).
// Block-scaled recipes quantise each operand along its GEMM's reduction dimension, so x and dy
// twice (rowwise for fprop / dgrad, columnwise for wgrad) and the weight columnwise for dgrad.
#pragma once

#include <memory>
#include <string>

#include "parallel/fp8_scaling.h"
#include "parallel/param.h"

namespace megatron {

class Linear {
 public:
  struct Ctx {
    Tensor x;          // input as the GEMM saw it (f32, or bf16 in bf16 runs); FP8: kept for a
                       // high-precision weight gradient only
    Fp8Tensor x8, w8;  // FP8: the quantised input and weight of the forward
    Fp8Tensor x8c;     // block-scaled FP8: the input quantised columnwise for the weight gradient
  };

  Linear(const std::string& name, int64_t in, int64_t out, bool with_bias, double init_std);

  // x [rows, in] f32 -> y [rows, out] f32.
  Tensor forward(const Tensor& x, Ctx& ctx) const;
  // dy [rows, out] (f32, or already in gemm_input_dtype()) -> dx [rows, in] (f32, f64 for f64);
  // weight.main_grad += dy^T x, bias.main_grad += sum dy.
  Tensor backward(const Tensor& dy, Ctx& ctx) const;

  void collect(std::vector<Param*>& out);
  // ctx.x as forward would keep it for input x (output-discarding recomputation: a norm whose
  // output this layer saved recomputes it and hands it back here; not under FP8).
  void keep_input(const Tensor& x, Ctx& ctx) const;
  // Runs the GEMMs in FP8 from now on; tp_rank/tp_size: the layer's TP group (the scaling
  // state is replicated over it). Returns the scaling state, owned by this Linear.
  Fp8GemmScaling* enable_fp8(const Fp8Config& cfg, int tp_rank, int tp_size);
  Fp8GemmScaling* fp8() const { return fp8_.get(); }
  // The dtype of the GEMMs outside FP8 (--no-fp8-wgrad): the compute weights', bf16 for an FP8
  // primary weight (its codes are bytes).
  DType high_precision_dtype() const { return weight.fp8 ? DType::kBF16 : weight.value.dtype(); }
  // The dtype the GEMMs take their activations in: the 16-bit compute dtype in bf16/fp16 runs
  // (forward's x and backward's dy are rounded to it), f32 under FP8 (quantised from f32) and in
  // f32 runs, f64 in f64 ones. A producer may write it directly and spare the rounding pass.
  DType gemm_input_dtype() const {
    const DType wt = weight.value.dtype();
    return !fp8_ && is_half(wt) ? wt : wt == DType::kF64 ? DType::kF64 : DType::kF32;
  }
  // Megatron's skip_bias_add: forward returns x A^T without the bias and backward leaves the
  // bias gradient to the caller, which fuses the bias into what follows (ops::bias_gelu_forward).
  void set_skip_bias_add(bool skip) { skip_bias_add_ = skip; }
  bool adds_bias() const { return has_bias() && !skip_bias_add_; }
  Param weight;
  Param bias;  // empty name when there is no bias
  bool has_bias() const { return !bias.name.empty(); }

 private:
  Tensor forward_fp8(const Tensor& x, Ctx& ctx) const;
  Tensor backward_fp8(const Tensor& dy, Ctx& ctx) const;

  int64_t in_, out_;
  bool skip_bias_add_ = false;
  std::unique_ptr<Fp8GemmScaling> fp8_;
};

}  // namespace megatron
