// LMHead: the output end of a language model: logits against the output weight, split along the
// vocabulary over tensor parallelism (Megatron's parallel_lm_logits), and the vocab-parallel
// cross entropy with the padding rows (>= vocab_size) masked out of the softmax, so that they
// never receive probability, loss or gradient.
//
// The output weight is one of three (Megatron's share_embeddings_and_output_weights):
// - untied: its own output_layer.weight [Vp/tp, h];
// - tied, the word embeddings on this same instance: that Param (pass it in);
// - tied, but the embedding lives on another pipeline stage: a copy of the word embeddings held
//   here under the same name (embedding.word_embeddings.weight), initialised identically (same
//   name, same Philox stream) and kept identical by summing both copies' gradients over the
//   embedding group (Param::shared_embedding).
//
// BERT's output layer also has a bias (output_layer.bias [Vp/tp], split like the weight).
//
// hidden is [s', b, h] (s' = s/tp under sequence parallelism); logits are [s b, Vp/tp] f32, row
// t b + i for position t of sequence i; labels and the per-token loss are Megatron's [b, s].
#pragma once

#include <string>

#include "models/common/vocab_shard.h"

namespace megatron {

class LMHead {
 public:
  struct Ctx {
    int64_t s = 0, b = 0;
    Tensor hidden;   // [s b, h], as the output GEMM saw it (f32, or bf16 in bf16 runs)
    Tensor logits;   // [s b, Vp/tp]; overwritten by dlogits in backward
    Tensor lse;      // [s b]
    Tensor targets;  // [s b] i64
  };

  // word_embeddings: the tied weight when the embedding is on this instance, else null.
  // output_bias: the output layer has a bias (BERT).
  // prefix: put before the head's own names (T5's "lm_head.").
  LMHead(const TransformerConfig& cfg, const TensorParallelContext& tp,
         const Param* word_embeddings, bool output_bias = false, const std::string& prefix = "");
  LMHead(const LMHead&) = delete;
  LMHead& operator=(const LMHead&) = delete;

  // Logits of every position (the GEMM needs them all: under sequence parallelism they are
  // gathered, else the hidden state enters the TP region). Kept in ctx.logits.
  Tensor logits(const Tensor& hidden, Ctx& ctx) const;
  // Generation and evaluation: the logits [s b, Vp] f32 of the whole padded vocabulary (each TP
  // rank's columns gathered in rank order, Megatron's parallel_output=False) of hidden [s, b, h]
  // (no sequence parallelism). Keeps nothing.
  Tensor gathered_logits(const Tensor& hidden) const;
  // Per-token loss [b, s] of labels [b, s] i64 (f32, or f64 in f64 models).
  Tensor loss(const Tensor& hidden, const Tensor& labels, Ctx& ctx) const;
  // dloss [b, s] -> the gradient of hidden [s', b, h]; accumulates the weight's (and bias's)
  // main_grad unless weight_grad is false (the weight detached: --mtp-detach-heads).
  Tensor loss_backward(const Tensor& dloss, Ctx& ctx, bool weight_grad = true) const;

  const Param& weight() const { return word_embeddings_ ? *word_embeddings_ : own_weight; }
  // The weight this instance holds (untied, or the pipeline's tied copy), else empty.
  Param own_weight;
  Param bias;  // output_layer.bias, or empty (no bias)
  // own_weight is the tied copy of the word embeddings (the first stage holds the original).
  bool holds_embedding_copy() const { return own_weight.shared_embedding; }

 private:
  bool scales_logits() const { return cfg_.mup.enabled && cfg_.mup.output_mult != 1.0; }
  const TransformerConfig& cfg_;
  TensorParallelContext tp_;
  VocabShard vocab_;
  const Param* word_embeddings_;
};

}  // namespace megatron
