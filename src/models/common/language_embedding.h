// LanguageEmbedding: Megatron's LanguageModelEmbedding, the input end of every language model
// here (GPT's, BERT's and T5's encoder and decoder, the language half of a vision-language model).
//
// word embeddings (split along the vocabulary over tensor parallelism) + learned absolute
// position embeddings (when the config asks for them; RoPE models rotate inside attention
// instead) + token-type embeddings (num_tokentypes > 0: BERT's sentence A/B), then dropout on the
// whole [s, b, h] embedding, and under --sequence-parallel each TP rank keeps its s/tp positions.
// A post-norm model (--transformer-block-type post_ln: BERT as Hugging Face has it) normalises the
// sum before the dropout (embedding.layernorm; on the whole sequence, so its gradients are
// complete on every TP rank).
// Inputs are Megatron's [b, s] batches; the output is [s, b, h] (or [s/tp, b, h]).
//
// The dropout mask is the single-process one in every layout: it is drawn over the local
// sequence before the sequence-parallel split, at the tokens' global rows under context
// parallelism (stream: ForwardMode::site_stream(-1, 0)). Default positions are the tokens'
// places in the whole sequence (context-parallel chunks included).
#pragma once

#include <optional>

#include "models/common/vocab_shard.h"
#include "transformer/forward_mode.h"
#include "transformer/norm.h"

namespace megatron {

class LanguageEmbedding {
 public:
  struct Ctx {
    int64_t s = 0, b = 0;
    Tensor ids, positions, token_types;  // [s, b] i64 (positions and token types when used)
    Norm::Ctx norm;                      // the post-norm model's embedding norm
    float dropout = 0;
    uint64_t seed = 0, stream = 0;
    bool scattered = false;  // the output was split over the sequence-parallel group
  };

  LanguageEmbedding(const TransformerConfig& cfg, const TensorParallelContext& tp,
                    int64_t num_tokentypes = 0);
  // Params point into ParamSets: never move or copy.
  LanguageEmbedding(const LanguageEmbedding&) = delete;
  LanguageEmbedding& operator=(const LanguageEmbedding&) = delete;

  // tokens [b, s] i64; positions [b, s] i64 or undefined (0..s-1); token_types [b, s] i64 (only
  // and always with num_tokentypes > 0). Returns [s', b, h] f32 (f64 in f64 models).
  // sequence_parallel_split false: [s, b, h] even under sequence parallelism (a vision-language
  // model splits after splicing the images in).
  // dropout_site: which dropout stream (ForwardMode::site_stream(dropout_site, 0)): -1 for the
  // model's input, another for a second lookup in the same micro-batch (multi-token prediction).
  Tensor forward(const Tensor& tokens, const Tensor& positions, const Tensor& token_types, Ctx& ctx,
                 const ForwardMode& mode, bool sequence_parallel_split = true,
                 int64_t dropout_site = -1) const;
  // dy: gradient of the output. Accumulates every table's main_grad.
  void backward(const Tensor& dy, Ctx& ctx) const;

  // word, position and token-type embeddings, those this config has.
  void collect(std::vector<Param*>& out);

  std::optional<Norm> layernorm;  // embedding.layernorm (cfg.post_layernorm)

  Param word_embeddings;       // embedding.word_embeddings.weight [Vp/tp, h]
  Param position_embeddings;   // embedding.position_embeddings.weight [max_pos, h] (learned only)
  Param tokentype_embeddings;  // embedding.tokentype_embeddings.weight [num_tokentypes, h]

 private:
  bool learned_positions() const;

  const TransformerConfig& cfg_;
  TensorParallelContext tp_;
  VocabShard vocab_;
};

// Transposes a [b, s] tensor (any dtype) into [s, b].
Tensor transpose_bs(const Tensor& x);
// Rows of a replicated `table` [rows, h] for `ids` (any shape, i64): [ids.numel(), h] in `act`
// dtype (bf16 tables are widened).
Tensor gather_rows(const Tensor& ids, const Tensor& table, DType act);

}  // namespace megatron
