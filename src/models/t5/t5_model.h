// T5Model: Megatron's T5Model (megatron/core/models/T5, r0.14): an encoder and a decoder stack
// over one shared language embedding, and an LM head on the decoder.
//
//   encoder:  embedding(enc tokens) -> encoder layers (bidirectional, never attending to padding)
//             -> encoder.final_layernorm = memory
//   decoder:  embedding(dec tokens) -> decoder layers (causal self-attention; cross-attention
//             over memory's real positions; MLP) -> decoder.final_layernorm
//   head:     lm_head.output_layer: the word embeddings + lm_head.output_layer.bias when tied
//             (Megatron's T5LMHead has a bias only then), its own weight without bias when
//             untied (--untie-embeddings-and-output-weights); per-token cross entropy.
//
// Positions: learned absolute (Megatron's default; one table, both stacks counting from 0), or
// T5's relative buckets (--position-embedding-type relative: no position table; a bias table per
// stack, encoder_relative_pos_emb bidirectional and decoder_relative_pos_emb causal, added to
// every self-attention of its stack), or RoPE.
//
// The encoder's config is the model's (num_layers, seq_length); the decoder's has
// decoder_num_layers layers over decoder_seq_length positions (Megatron r0.14 builds as many
// decoder layers as encoder layers whatever --decoder-num-layers says; we honour the flag, whose
// default is the encoder's count). Dropout streams: the decoder's layers count after the
// encoder's, and the decoder's embedding has a stream of its own.
//
// Parallelism: tensor parallelism as GPT's (vocabulary-split embedding and head, TP attention,
// cross-attention and MLP), sequence parallelism on both stacks (memory stays split by sequence;
// every decoder layer's cross-attention gathers it, and its gradient is summed over the decoder
// layers then reduce-scattered). No pipeline stages: Megatron r0.14 removed them for T5.
#pragma once

#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "models/common/language_embedding.h"
#include "models/common/lm_head.h"
#include "transformer/config.h"
#include "transformer/relative_position.h"
#include "transformer/transformer_block.h"

namespace megatron {

// What the model reads (pretrain_t5.py's get_batch names in brackets).
struct T5Inputs {
  Tensor enc_tokens;  // [b, s_enc] i64 (text_enc)
  Tensor dec_tokens;  // [b, s_dec] i64 (text_dec)
  Tensor enc_valid;   // [b, s_enc] i32, nonzero for real tokens (enc_mask); undefined: all real
  Tensor dec_valid;   // [b, s_dec] i32 (dec_mask); undefined: all real
  Tensor labels;      // [b, s_dec] i64, -1 at padding (labels)
};

class T5Model {
 public:
  struct Ctx {
    LanguageEmbedding::Ctx enc_embedding, dec_embedding;
    TransformerBlock::Ctx encoder, decoder;
    LMHead::Ctx head;
  };

  // tp: null for one process. amax: FP8 delayed scaling's amax reduction group (null: none).
  T5Model(const TransformerConfig& cfg, std::shared_ptr<ProcessGroup> tp = nullptr,
          bool sequence_parallel = false, ProcessGroup* amax = nullptr);
  T5Model(const T5Model&) = delete;
  T5Model& operator=(const T5Model&) = delete;

  // Per-token loss [b, s_dec] of the labels (any -1 counted as id 0: the loss mask removes it).
  Tensor forward(const T5Inputs& in, Ctx& ctx, const ForwardMode& mode) const;
  // d_token_loss [b, s_dec]: accumulates every parameter's gradient; `done` hears of each
  // parameter once its gradient is final.
  void backward(const Tensor& d_token_loss, Ctx& ctx, const ParamsDone& done = {}) const;
  // Logits [s_dec b, Vp] f32 of the whole padded vocabulary (no TP; tests and tools).
  Tensor forward_logits(const T5Inputs& in, Ctx& ctx, const ForwardMode& mode) const;

  // Generation (no sequence parallelism, nothing kept for backward). encode: the encoder's output
  // [s_enc, b, h] for enc_tokens [b, s_enc] (enc_valid [b, s_enc] i32 or undefined).
  Tensor encode(const Tensor& enc_tokens, const Tensor& enc_valid, const ForwardMode& mode) const;
  // decode: the logits [s b, Vp] f32 (each TP rank's columns gathered; the last position's
  // only, [b, Vp], with last_only) of decoder tokens [b, s]. With mode.kv_cache the tokens are
  // the s positions after the cache's offset() (the decoder's self-attention keys and values and
  // the cross-attention's over memory are cached; the caller advances the offset); without, they
  // are the whole decoder input from position 0.
  Tensor decode(const Tensor& dec_tokens, const Tensor& memory, const Tensor& enc_valid,
                const ForwardMode& mode, bool last_only) const;

  std::vector<Param*> parameters();
  const TransformerConfig& config() const { return cfg_; }
  const TransformerConfig& decoder_config() const { return dec_cfg_; }
  const TensorParallelContext& tensor_parallel() const { return tp_; }
  // [s_enc', b, h] (s' = s/tp under sequence parallelism), the encoder's output.
  Shape memory_shape(int64_t micro_batch_size) const;

  std::unique_ptr<LanguageEmbedding> embedding;
  std::unique_ptr<RelativePositionBias> encoder_relative_pos_emb, decoder_relative_pos_emb;
  std::unique_ptr<TransformerBlock> encoder, decoder;
  std::unique_ptr<LMHead> head;

 private:
  // The decoder's final hidden state [s_dec', b, h].
  Tensor run(const T5Inputs& in, Ctx& ctx, const ForwardMode& mode) const;
  std::vector<const Param*> outer_params() const;  // not in a block: embedding, biases, head

  TransformerConfig cfg_, dec_cfg_;
  std::shared_ptr<ProcessGroup> tp_group_;
  TensorParallelContext tp_;
};

// The decoder's config of an encoder-decoder model config.
TransformerConfig t5_decoder_config(const TransformerConfig& cfg);

}  // namespace megatron
