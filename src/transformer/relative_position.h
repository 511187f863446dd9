// RelativePositionBias: T5's bucketed relative-position bias (Megatron's
// RelativePositionEmbedding, Hugging Face's T5Attention.compute_bias), one per stack.
//
// The key at position j and the query at position i are d = j - i apart. The bucket of d:
//   bidirectional (encoder): half of the buckets for d > 0, half for d <= 0, over |d|;
//   causal (decoder): only d <= 0 counts, over -d (later keys share bucket 0, masked anyway);
//   within that half, the first half of the buckets are exact distances 0 .. n/2 - 1, the rest
//   logarithmic up to max_distance: n/2 + trunc(log(|d| / (n/2)) / log(max_distance / (n/2))
//   x (n - n/2)), computed in float32 as both do, capped at the last bucket.
// The table relative_attention_bias.weight [buckets, heads] (init N(0, init_method_std), as
// Megatron's init_method) gives bias[h, i, j] = table[bucket(j - i), h], added to every layer's
// self-attention scores after the scale (never to cross-attention).
//
// Tensor parallelism: every rank holds the whole table and uses its own heads' columns, so each
// rank's gradient is zero in the others' columns; the table is marked like a sequence-parallel
// replica and summed over TP before the step (as Megatron's scatter of the bias over heads
// implies).
#pragma once

#include <string>
#include <vector>

#include "parallel/param.h"
#include "transformer/config.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

// The bucket of key-minus-query distance d (exposed for tests).
int64_t relative_position_bucket(int64_t d, bool bidirectional, int64_t num_buckets,
                                 int64_t max_distance);

class RelativePositionBias {
 public:
  // name: the module, e.g. "encoder_relative_pos_emb".
  RelativePositionBias(const std::string& name, const TransformerConfig& cfg,
                       const TensorParallelContext& tp, bool bidirectional);
  RelativePositionBias(const RelativePositionBias&) = delete;
  RelativePositionBias& operator=(const RelativePositionBias&) = delete;

  // This rank's heads' bias [1, np/tp, sq, sk] in dtype `dtype` (the attention's), for queries
  // at positions q_offset .. q_offset + sq - 1 (generation after cached ones) and keys 0 .. sk - 1.
  Tensor forward(int64_t sq, int64_t sk, DType dtype, int64_t q_offset = 0) const;
  // dbias [1, np/tp, sq, sk] (summed over the layers that used the bias): accumulates this
  // rank's columns of the table's main_grad.
  void backward(const Tensor& dbias) const;
  void collect(std::vector<Param*>& out) { out.push_back(&weight); }

  Param weight;  // <name>.relative_attention_bias.weight [buckets, heads]

 private:
  const TransformerConfig& cfg_;
  TensorParallelContext tp_;
  bool bidirectional_;
  int64_t heads_local_;
};

}  // namespace megatron
