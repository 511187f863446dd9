// Norm: LayerNorm (weight and bias) or RMSNorm (weight only) over the hidden dim, chosen by
// --normalization. Statistics are kept for backward; the input is kept too (recomputing xhat is
// cheaper than storing it). With a zero-centred gamma (--apply-layernorm-1p) the scale is
// 1 + weight, formed in f32 at each call (as Megatron's fused kernels do), and the weight starts
// at 0; its gradient is the scale's.
#pragma once

#include <string>

#include "parallel/param.h"
#include "transformer/config.h"

namespace megatron {

class Norm {
 public:
  struct Ctx {
    Tensor x, mean, rstd;
  };

  // learnable false: a fixed scale of ones and no parameters (Megatron's L2Norm, --qk-l2-norm).
  Norm(const std::string& name, int64_t hidden, Normalization kind, double eps,
       bool zero_centered_gamma = false, bool learnable = true);
  // From the config: hidden size, --normalization, --norm-epsilon, --apply-layernorm-1p.
  Norm(const std::string& name, const TransformerConfig& cfg)
      : Norm(name, cfg.hidden_size, cfg.normalization, cfg.norm_epsilon,
             cfg.layernorm_zero_centered_gamma) {}

  Tensor forward(const Tensor& x, Ctx& ctx) const { return forward(x, ctx, x.dtype()); }
  // The output in `out` (x's dtype, or bf16/f16 for f32 x when only a 16-bit GEMM reads it:
  // TransformerLayer passes the next linear's gemm_input_dtype()).
  Tensor forward(const Tensor& x, Ctx& ctx, DType out) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);
  // Under sequence parallelism each TP rank normalises only its positions: its weight and bias
  // gradients are partial sums (Param::sequence_parallel).
  void mark_sequence_parallel(bool on) { weight.sequence_parallel = bias.sequence_parallel = on; }

  Param weight, bias;  // bias unused (empty name) for RMSNorm

 private:
  // The scale the op applies: the weight, 1 + weight when zero-centred, ones when not learnable.
  Tensor gamma(DType dtype, Device where) const;

  Normalization kind_;
  float eps_;
  bool zero_centered_;
  bool learnable_;
  int64_t hidden_;
};

}  // namespace megatron
