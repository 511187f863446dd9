// GPTModel: embeddings, the transformer decoder, the output layer and the fused LM loss.
//
// Covers GPT-2 style (learned absolute positions, LayerNorm, GELU, biases, tied embeddings) and
// Llama style (RoPE, RMSNorm, SwiGLU, no biases, GQA, untied output) through TransformerConfig.
// Inputs are Megatron's [b, s] token batches; inside, activations are [s, b, h]. The output layer
// has padded_vocab_size rows; rows >= vocab_size are padding and are masked out of the softmax,
// so they never receive probability, loss or gradient.
#pragma once

#include <memory>
#include <vector>

#include "transformer/config.h"
#include "transformer/transformer_block.h"

namespace megatron {

class GPTModel {
 public:
  struct Ctx {
    int64_t s = 0, b = 0;
    Tensor ids, positions, targets;  // [s, b] i64
    float emb_dropout = 0;
    uint64_t seed = 0, emb_stream = 0;
    TransformerBlock::Ctx decoder;
    Tensor hidden;  // final hidden [s * b, h], as the output GEMM saw it (f32 or bf16)
    Tensor logits;  // [s * b, Vp] f32; becomes dlogits in backward
    Tensor lse;     // [s * b]
  };

  explicit GPTModel(const TransformerConfig& cfg);
  // Layers hold references to cfg_ and ParamSets hold pointers to the Params: never move or copy.
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // tokens, labels: [b, s] i64; positions: [b, s] i64 or undefined (0..s-1); doc_start: [b, s]
  // i32 document starts for --reset-attention-mask, or undefined. Returns the per-token loss
  // [b, s] (f32, or f64 in f64 models). Keeps what backward needs in ctx.
  Tensor forward(const Tensor& tokens, const Tensor& labels, const Tensor& positions, Ctx& ctx,
                 const ForwardMode& mode, const Tensor& doc_start = Tensor()) const;
  // Logits [s * b, Vp] for the given tokens (row t * b + i is position t of sequence i).
  Tensor forward_logits(const Tensor& tokens, const Tensor& positions, Ctx& ctx,
                        const ForwardMode& mode, const Tensor& doc_start = Tensor()) const;
  // dloss [b, s]: gradient of the objective w.r.t. each per-token loss. Accumulates main_grad.
  void backward(const Tensor& dloss, Ctx& ctx) const;

  // Every parameter, in registration order (embedding, decoder layers, final norm, output).
  std::vector<Param*> parameters();
  const TransformerConfig& config() const { return cfg_; }

  Param word_embeddings;      // embedding.word_embeddings.weight [Vp, h]
  Param position_embeddings;  // embedding.position_embeddings.weight [max_pos, h] (learned only)
  std::unique_ptr<TransformerBlock> decoder;
  Param output_layer;  // output_layer.weight [Vp, h] (untied only)

 private:
  const Param& output_weight() const;
  TransformerConfig cfg_;
};

// Transposes a [b, s] tensor of i64 into [s, b].
Tensor transpose_bs(const Tensor& x);

}  // namespace megatron
