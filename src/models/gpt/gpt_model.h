// GPTModel: embeddings, the transformer decoder, the output layer and the fused LM loss; or, in a
// pipeline, one stage's part of them. The two ends are the shared language-model parts of
// models/common (LanguageEmbedding, LMHead); GPT itself is how they and the decoder are staged.
//
// Covers GPT-2 style (learned absolute positions, LayerNorm, GELU, biases, tied embeddings) and
// Llama style (RoPE, RMSNorm, SwiGLU, no biases, GQA, untied output) through TransformerConfig.
// Inputs are Megatron's [b, s] token batches; inside, activations are [s, b, h]. The output layer
// has padded_vocab_size rows; rows >= vocab_size are padding and are masked out of the softmax,
// so they never receive probability, loss or gradient.
//
// Parallelism (GPTStage): under tensor parallelism the word embeddings and the output layer are
// split along the vocabulary (Megatron's VocabParallelEmbedding and vocab-parallel cross entropy:
// rank r holds rows [r Vp/tp, (r+1) Vp/tp)), attention and MLP as their classes say; with
// --sequence-parallel the activations between them are [s/tp, b, h]. A pipeline stage holds a
// contiguous run of layers (global numbers), the embeddings only on the first stage
// (pre_process) and the final norm, output layer and loss only on the last (post_process). With
// tied embeddings the last stage of a pipeline keeps its own copy of the word embeddings as the
// output weight, initialised identically (same name, same Philox stream) and kept identical by
// summing both copies' gradients over the embedding group (Megatron's shared embedding).
// Multi-token prediction (models/gpt/mtp.h) runs on the last stage after the decoder; in training
// forward_stage leaves its per-depth losses in Ctx::mtp_losses (GPTChunk hands them to GPTLoss).

#pragma once

#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "models/common/language_embedding.h"
#include "models/common/lm_head.h"
#include "models/gpt/mtp.h"
#include "transformer/config.h"
#include "transformer/transformer_block.h"

namespace megatron {

// The part of the model one instance holds, and its tensor-parallel group.
struct GPTStage {
  std::shared_ptr<ProcessGroup> tp;   // null: no tensor parallelism
  bool sequence_parallel = false;     // --sequence-parallel (ignored without TP)
  int64_t first_layer = 0;            // global number of this stage's first layer
  int64_t num_layers = -1;            // -1: every layer from first_layer on
  bool pre_process = true;            // holds the embeddings (first pipeline stage)
  bool post_process = true;           // holds final norm, output layer, loss (last stage)
  ContextParallelContext cp = {};     // --context-parallel-size: this rank's sequence chunks
  ExpertParallelContext expert = {};  // MoE layers' expert split (default: EP 1, ETP = TP)
  ProcessGroup* amax = nullptr;       // FP8 delayed scaling's amax reduction group (null: none)
};

// What a stage reads of the micro-batch: tokens and positions on the first stage, labels on the
// last, doc_start on every stage with --reset-attention-mask (attention) or packed documents
// (--dataloader-inter-document-masking: also the Mamba layers and multi-token prediction).
struct GPTInputs {
  Tensor tokens;     // [b, s] i64
  Tensor labels;     // [b, s] i64
  Tensor positions;  // [b, s] i64, or undefined: 0..s-1
  Tensor doc_start;  // [b, s] i32, or undefined: one document per sequence
  // The first stage's decoder input [s', b, h] made by the caller instead of the embedding
  // (Megatron's decoder_input: a vision-language model's spliced text and image embeddings);
  // backward_stage then returns its gradient and leaves the embedding to the caller.
  Tensor decoder_input;
  bool packed = false;  // doc_start's documents are packed sequences (TokenLayout::packed)
};

class GPTModel {
 public:
  struct Ctx {
    LanguageEmbedding::Ctx embedding;
    TransformerBlock::Ctx decoder;
    LMHead::Ctx head;            // head.logits: [s * b, Vp/tp] f32 after a forward
    bool decoder_input = false;  // the first stage's input came from the caller
    // Multi-token prediction (last stage, training): each depth's per-token loss [b, s] after a
    // forward; their gradients are set here before backward.
    MultiTokenPrediction::Ctx mtp;
    std::vector<Tensor> mtp_losses, mtp_dlosses;
  };

  explicit GPTModel(const TransformerConfig& cfg, GPTStage stage = {});
  // Layers hold references to cfg_ and ParamSets hold pointers to the Params: never move or copy.
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  // Whole model (pre_process and post_process). tokens, labels: [b, s] i64; positions: [b, s]
  // i64 or undefined (0..s-1); doc_start: [b, s] i32 document starts for
  // --reset-attention-mask, or undefined; packed: they are packed sequences (TokenLayout::
  // packed). Returns the per-token loss [b, s] (f32, or f64 in f64 models). Keeps what backward
  // needs in ctx.
  Tensor forward(const Tensor& tokens, const Tensor& labels, const Tensor& positions, Ctx& ctx,
                 const ForwardMode& mode, const Tensor& doc_start = Tensor(),
                 bool packed = false) const;
  // Logits [s * b, Vp] for the given tokens (row t * b + i is position t of sequence i). Whole
  // model without tensor parallelism only.
  Tensor forward_logits(const Tensor& tokens, const Tensor& positions, Ctx& ctx,
                        const ForwardMode& mode, const Tensor& doc_start = Tensor()) const;
  // Generation and evaluation, one pipeline stage, no sequence or context parallelism: the
  // forward of new positions (mode.kv_cache: after the cached ones, at positions offset ..; no
  // cache: a whole sequence from 0). tokens and positions ([b, s] i64, positions undefined:
  // from the cache's offset) on the first stage, hidden_in ([s, b, h]) on the others. Returns the
  // stage's output [s, b, h], or on the last stage the logits [s b, Vp] f32 over the whole padded
  // vocabulary (gathered over TP) of every position, or of the last one only ([b, Vp]) with
  // last_only. Keeps nothing for backward.
  // decoder_input (first stage, optional): the caller's embeddings [s, b, h] instead of tokens.
  Tensor infer_stage(const Tensor& hidden_in, const Tensor& tokens, const Tensor& positions,
                     const ForwardMode& mode, bool last_only,
                     const Tensor& decoder_input = Tensor()) const;
  // dloss [b, s]: gradient of the objective w.r.t. each per-token loss. Accumulates main_grad.
  void backward(const Tensor& dloss, Ctx& ctx) const;

  // One pipeline stage. hidden_in: the previous stage's output [s', b, h] (s' = s/tp under
  // sequence parallelism), unused on the first stage, which embeds in.tokens. Returns the
  // per-token loss [b, s] on the last stage, else this stage's output [s', b, h].
  Tensor forward_stage(const Tensor& hidden_in, const GPTInputs& in, Ctx& ctx,
                       const ForwardMode& mode) const;
  // d: dloss [b, s] on the last stage, else the gradient of this stage's output. Returns the
  // gradient of hidden_in (undefined on the first stage). `done` (optional) hears of every
  // parameter as soon as this backward has finished its gradient.
  Tensor backward_stage(const Tensor& d, Ctx& ctx, const ParamsDone& done = {}) const;

  // Every parameter, in registration order (embedding, decoder layers, final norm, output).
  std::vector<Param*> parameters();
  const TransformerConfig& config() const { return cfg_; }
  const GPTStage& stage() const { return stage_; }
  ProcessGroup& tp_group() const { return *stage_.tp; }
  // Shape of the activation a stage receives and sends: [s', b, h], s' = s / cp (/ tp under
  // sequence parallelism).
  Shape activation_shape(int64_t micro_batch_size) const;

  // The word embeddings: the first stage's, or the last stage's tied copy (null on a middle
  // stage, or on a last stage with an untied output layer and no embedding).
  const Param* word_embeddings() const;
  Param* word_embeddings();

  std::unique_ptr<LanguageEmbedding> embedding;  // first stage
  std::unique_ptr<TransformerBlock> decoder;
  std::unique_ptr<LMHead> head;  // last stage
  // --mtp-num-layers: on the last stage, after the decoder. Without the first stage there the
  // last stage holds `embedding` too, for the rolled tokens: a copy of the word embeddings kept
  // identical as the tied output weight's copy is (summed over the embedding group).
  std::unique_ptr<MultiTokenPrediction> mtp;

 private:
  // --embedding-init-method-std and --init-method-xavier-uniform on the parameters' init specs.
  void apply_init_methods();
  void report(const ParamsDone& done, std::initializer_list<const Param*> ps) const;
  void report_all(const ParamsDone& done, const std::vector<const Param*>& ps) const;
  // The registered ones of ps (a RoPE model's position table has no name and no storage).
  static std::vector<const Param*> named(std::initializer_list<const Param*> ps);

  TransformerConfig cfg_;
  GPTStage stage_;
  TensorParallelContext tp_;
};

}  // namespace megatron
