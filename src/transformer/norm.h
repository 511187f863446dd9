// Norm: LayerNorm (weight and bias) or RMSNorm (weight only) over the hidden dim, chosen by
// --normalization. Statistics are kept for backward; the input is kept too (recomputing xhat is
// cheaper than storing it).
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

  Norm(const std::string& name, int64_t hidden, Normalization kind, double eps);

  Tensor forward(const Tensor& x, Ctx& ctx) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);
  // Under sequence parallelism each TP rank normalises only its positions: its weight and bias
  // gradients are partial sums (Param::sequence_parallel).
  void mark_sequence_parallel(bool on) { weight.sequence_parallel = bias.sequence_parallel = on; }

  Param weight, bias;  // bias unused (empty name) for RMSNorm

 private:
  Normalization kind_;
  float eps_;
};

}  // namespace megatron
