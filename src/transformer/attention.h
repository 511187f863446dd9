// SelfAttention: packed QKV projection, optional RoPE, causal core attention, output projection.
//
// linear_qkv produces Megatron's per-query-group packing: for each of ng groups, qpg query heads
// then one key and one value head, each hn wide ([s, b, ng, qpg + 2, hn]); the core attention
// reads q, k, v from that buffer in place. With GQA (ng < heads) each key/value head serves qpg
// query heads. linear_proj maps the heads' outputs back to the hidden size (scaled init).
#pragma once

#include <string>

#include "parallel/tensor_parallel_linear.h"
#include "tensor/ops.h"
#include "transformer/config.h"
#include "transformer/forward_mode.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class SelfAttention {
 public:
  struct Ctx {
    ColumnParallelLinear::Ctx qkv_ctx;
    RowParallelLinear::Ctx proj_ctx;
    Tensor qkv;  // [s, b, ng/tp, qpg + 2, hn], after RoPE
    Tensor out;  // [s, b, np/tp, hn]
    Tensor lse;  // [b, np/tp, s]
    Tensor positions;
    Tensor doc_start;         // keeps spec.doc_start alive until backward
    ops::AttentionSpec spec;  // as run in forward, including the dropout RNG coordinates
  };

  SelfAttention(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                const TensorParallelContext& tp);

  // x [s, b, h] -> [s, b, h] ([s/tp, b, h] under sequence parallelism).
  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

  ColumnParallelLinear linear_qkv;
  RowParallelLinear linear_proj;

 private:
  const TransformerConfig& cfg_;
  int64_t layer_;
  TensorParallelContext tp_;
  int64_t groups_local_, heads_local_;  // query groups and heads on this TP rank
  ops::RopeSpec rope_;
};

}  // namespace megatron
