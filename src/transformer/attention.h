// SelfAttention: packed QKV projection, optional RoPE, causal core attention, output projection.
//
// linear_qkv produces Megatron's per-query-group packing: for each of ng groups, qpg query heads
// then one key and one value head, each hn wide ([s, b, ng, qpg + 2, hn]); the core attention
// reads q, k, v from that buffer in place. With GQA (ng < heads) each key/value head serves qpg
// query heads. linear_proj maps the heads' outputs back to the hidden size (scaled init).
#pragma once

#include <string>

#include "tensor/ops.h"
#include "transformer/config.h"
#include "transformer/forward_mode.h"
#include "transformer/linear.h"

namespace megatron {

class SelfAttention {
 public:
  struct Ctx {
    Linear::Ctx qkv_ctx, proj_ctx;
    Tensor qkv;  // [s, b, ng, qpg + 2, hn], after RoPE
    Tensor out;  // [s, b, np, hn]
    Tensor lse;  // [b, np, s]
    Tensor positions;
    Tensor doc_start;         // keeps spec.doc_start alive until backward
    ops::AttentionSpec spec;  // as run in forward, including the dropout RNG coordinates
  };

  SelfAttention(const std::string& name, const TransformerConfig& cfg, int64_t layer_number);

  // x [s, b, h] -> [s, b, h].
  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

  Linear linear_qkv, linear_proj;

 private:
  const TransformerConfig& cfg_;
  int64_t layer_;
  ops::RopeSpec rope_;
};

}  // namespace megatron
