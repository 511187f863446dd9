// BertModel: Megatron's BertModel (megatron/core/models/bert, r0.14), or in a pipeline one stage's
// part of it: the language embedding with token types, a bidirectional transformer encoder
// that never attends to padding, and on the last stage the two heads.
//
//   masked LM:  hidden -> lm_head.dense (h -> h) -> GELU (erf) -> lm_head.layer_norm
//               -> output layer (the word embeddings unless untied; output_layer.bias [V])
//               -> per-token cross entropy against the labels ("lm loss")
//   sentence order (binary head, default on): hidden at [CLS] -> pooler (dense + tanh)
//               -> binary_head (h -> 2) -> cross entropy against is_random ("sop loss")
//
// --bert-no-binary-head drops the token-type embeddings, the pooler and the binary head, as
// Megatron does. A classifier (num_classes > 0: `megatron finetune --task`, Megatron's
// Classification model) has token types, the pooler, dropout and classification_head (h -> C) on
// the last stage instead of both pretraining heads. The layer norm placement is Megatron's pre-LN
// by default; with
// --transformer-block-type post_ln the model is the original (Hugging Face BertModel) post-LN
// BERT, with the embedding norm (transformer/transformer_layer.h).
//
// Parallelism is GPT's (models/gpt/gpt_model.h): vocabulary-split embedding and output layer,
// TP attention and MLP, sequence parallelism between them, pipeline stages of consecutive
// layers with a tied copy of the word embeddings on the last stage. Under --sequence-parallel
// the LM head's dense and norm run on this rank's positions (their gradients are partial over
// TP, marked as Megatron marks them); the pooler gathers the sequence first.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "comm/process_group.h"
#include "models/common/language_embedding.h"
#include "models/common/lm_head.h"
#include "models/common/pooler.h"
#include "parallel/linear.h"
#include "transformer/config.h"
#include "transformer/norm.h"
#include "transformer/transformer_block.h"

namespace megatron {

struct BertStage {
  std::shared_ptr<ProcessGroup> tp;  // null: no tensor parallelism
  bool sequence_parallel = false;
  int64_t first_layer = 0;
  int64_t num_layers = -1;  // -1: every layer from first_layer on
  bool pre_process = true;
  bool post_process = true;
  bool binary_head = true;       // false with --bert-no-binary-head
  int64_t num_classes = 0;       // > 0: a sequence classifier (no pretraining heads)
  ProcessGroup* amax = nullptr;  // FP8 delayed scaling's amax reduction group (null: none)
};

// What a stage reads of the micro-batch (Megatron's get_batch names in brackets).
struct BertInputs {
  Tensor tokens;        // [b, s] i64 ("text"), first stage
  Tensor types;         // [b, s] i64, first stage with the binary head
  Tensor padding_mask;  // [b, s] i32, nonzero for real tokens, every stage
  Tensor labels;        // [b, s] i64, -1 where no prediction is made, last stage
};

class BertModel {
 public:
  struct Ctx {
    LanguageEmbedding::Ctx embedding;
    TransformerBlock::Ctx encoder;
    Linear::Ctx lm_dense;
    Tensor lm_pre_gelu;  // lm_head.dense output [n, h]
    Norm::Ctx lm_norm;
    LMHead::Ctx head;
    Pooler::Ctx pooler;
    Linear::Ctx binary;
    Tensor sop_logits, sop_lse, sop_targets;  // [b, 2], [b], [b]
    Linear::Ctx classifier;
    float dropout = 0;  // the classifier's dropout on the pooled output
    uint64_t seed = 0, stream = 0;
    Shape hidden_shape;
  };
  struct Outputs {
    Tensor token_loss;  // [b, s] per-token LM loss (any label -1 counted as id 0: mask it)
    Tensor sop_loss;    // [b] per-sequence sentence-order loss (binary head), else undefined
    Tensor hidden;      // a middle stage's output [s', b, h]
    Tensor logits;      // a classifier's [b, C] f32
  };

  explicit BertModel(const TransformerConfig& cfg, BertStage stage = {});
  BertModel(const BertModel&) = delete;
  BertModel& operator=(const BertModel&) = delete;

  // One stage: hidden_in is the previous stage's [s', b, h] (unused on the first). is_random
  // ([b] i64, the SOP labels) is read on the last stage with the binary head.
  Outputs forward_stage(const Tensor& hidden_in, const BertInputs& in, const Tensor& is_random,
                        Ctx& ctx, const ForwardMode& mode) const;
  // Last stage: d_token_loss [b, s] and d_sop_loss [b] (undefined without the binary head), or
  // a classifier's d_logits [b, C] in d_token_loss; else d_hidden. Returns the gradient of
  // hidden_in (undefined on the first stage).
  Tensor backward_stage(const Tensor& d_token_loss, const Tensor& d_sop_loss,
                        const Tensor& d_hidden, Ctx& ctx, const ParamsDone& done = {}) const;
  // The heads' outputs without a loss (whole model, no TP): MLM logits [s b, Vp] and SOP logits
  // [b, 2] (undefined without the binary head). For tests and tools.
  std::pair<Tensor, Tensor> forward_logits(const BertInputs& in, Ctx& ctx,
                                           const ForwardMode& mode) const;

  std::vector<Param*> parameters();
  const TransformerConfig& config() const { return cfg_; }
  const BertStage& stage() const { return stage_; }
  Shape activation_shape(int64_t micro_batch_size) const;

  std::unique_ptr<LanguageEmbedding> embedding;  // first stage
  std::unique_ptr<TransformerBlock> encoder;
  // Last stage:
  std::unique_ptr<Linear> lm_dense;             // lm_head.dense
  std::unique_ptr<Norm> lm_norm;                // lm_head.layer_norm
  std::unique_ptr<LMHead> head;                 // output_layer (tied or not) + output_layer.bias
  std::unique_ptr<Pooler> pooler;               // with the binary head
  std::unique_ptr<Linear> binary_head;          // binary_head, h -> 2
  std::unique_ptr<Linear> classification_head;  // a classifier's, h -> C

 private:
  TokenLayout layout(const BertInputs& in) const;
  // This stage's parameters outside the encoder's layers (embedding, heads).
  std::vector<const Param*> outer_params() const;
  // The embedding has token types (binary head or classifier).
  bool typed() const { return stage_.binary_head || stage_.num_classes > 0; }
  // The LM head's transform: [s', b, h] -> [s', b, h].
  Tensor lm_transform(const Tensor& hidden, Ctx& ctx) const;
  Tensor lm_transform_backward(const Tensor& d, Ctx& ctx) const;

  TransformerConfig cfg_;
  BertStage stage_;
  TensorParallelContext tp_;
};

}  // namespace megatron
