// The vocabulary split over a tensor-parallel group (Megatron's VocabParallelEmbedding and the
// vocab-parallel output layer): rank r holds rows [r Vp/tp, (r + 1) Vp/tp) of the padded
// vocabulary. Shared by the embedding and the LM head so that both cut it the same way.
#pragma once

#include "parallel/mappings.h"
#include "parallel/param.h"
#include "transformer/config.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

struct VocabShard {
  int64_t start = 0;  // first vocabulary row on this rank
  int64_t rows = 0;   // rows on this rank (padded_vocab_size / tp)
};

inline VocabShard vocab_shard(const TransformerConfig& cfg, const TensorParallelContext& tp) {
  const int64_t rows = divide(cfg.padded_vocab_size, tp.size(),
                              "the padded vocabulary by --tensor-model-parallel-size (pad it "
                              "with --make-vocab-size-divisible-by)");
  return VocabShard{tp.rank() * rows, rows};
}

// A [Vp/tp, h] table of this rank's vocabulary rows (word embeddings or output layer).
inline void make_vocab_table(Param& p, const std::string& name, const TransformerConfig& cfg,
                             const TensorParallelContext& tp) {
  p.name = name;
  p.shape = {vocab_shard(cfg, tp).rows, cfg.hidden_size};
  p.init_std = cfg.init_method_std;
  p.is_embedding_or_output = true;
  p.tp_partition_dim = 0;
  p.tp_rank = tp.rank();
  p.tp_size = tp.size();
}

}  // namespace megatron
