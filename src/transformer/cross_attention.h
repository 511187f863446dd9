// CrossAttention: T5's decoder attending over the encoder's output (Megatron's CrossAttention).
//
// linear_q maps the decoder's hidden state to the query heads ([sq, b, np, hn]); linear_kv maps
// the encoder's output to a key and a value per head, packed per head as [k_h | v_h]
// ([sk, b, np, 2, hn], Megatron's split of the last dim in two); core attention over every real
// encoder position (no causal mask: key_valid from the encoder's padding); linear_proj back to
// the hidden size (scaled init). Grouped-query attention is refused, as Megatron does.
//
// Tensor parallelism: linear_q and linear_kv are column parallel (this rank's heads), linear_proj
// row parallel. Under sequence parallelism both inputs hold this rank's s/tp positions and are
// gathered by their linears; backward reduce-scatters each gradient back. The encoder output's
// gradient is returned separately: every decoder layer adds its share to it.
//
// Generation (mode.kv_cache): the memory's keys and values are computed at the first step and
// kept in the cache (KvCache::cross_kv) for every later one; nothing is kept for backward.
#pragma once

#include <string>

#include "parallel/tensor_parallel_linear.h"
#include "tensor/ops.h"
#include "transformer/config.h"
#include "transformer/forward_mode.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class CrossAttention {
 public:
  struct Ctx {
    ColumnParallelLinear::Ctx q_ctx, kv_ctx;
    RowParallelLinear::Ctx proj_ctx;
    Tensor q;    // [sq, b, np/tp, hn]
    Tensor kv;   // [sk, b, np/tp, 2, hn]
    Tensor out;  // [sq, b, np/tp, hn]
    Tensor lse;  // [b, np/tp, sq]
    ops::AttentionSpec spec;
  };

  // stream_layer keys the attention dropout's stream (site 4 of that layer).
  CrossAttention(const std::string& name, const TransformerConfig& cfg, int64_t stream_layer,
                 const TensorParallelContext& tp);

  // x [sq', b, h] (the decoder), memory [sk', b, h] (the encoder's output), memory_valid [b, sk]
  // i32 (nonzero for real encoder positions; undefined: all real) -> [sq', b, h].
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& memory_valid, Ctx& ctx,
                 const ForwardMode& mode) const;
  // Returns the gradient of x; d_memory gets the gradient of memory ([sk', b, h]).
  Tensor backward(const Tensor& dy, Ctx& ctx, Tensor* d_memory) const;
  void collect(std::vector<Param*>& out);

  ColumnParallelLinear linear_q, linear_kv;
  RowParallelLinear linear_proj;

 private:
  const TransformerConfig& cfg_;
  int64_t stream_layer_;
  TensorParallelContext tp_;
  int64_t heads_local_;
};

}  // namespace megatron
