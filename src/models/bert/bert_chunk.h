// BERT as the trainer sees it: BertChunk (one pipeline stage of a BertModel as a ModelChunk) and
// BertLoss (pretrain_bert.py's loss_func).
//
// Batch fields, Megatron's get_batch names (pretrain_bert.py), all [b, s] but is_random [b]:
// "tokens" (text) and "types" on the first stage, "padding_mask" on every stage (attention never
// sees padding), "labels", "loss_mask" and "is_random" on the last. Stages pass "hidden"; the
// last stage outputs "per-token loss" [b, s] and, with the binary head, "sop loss" [b].
// A classifier (BertStage::num_classes > 0) reads "label" [b] (the class, -1 for a padding
// sample) on the last stage instead, and outputs "logits" [b, C] to ClassificationLoss.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/bert/bert_model.h"
#include "models/model_chunk.h"
#include "models/model_spec.h"

namespace megatron {

inline constexpr const char* kBertTypes = "types";
inline constexpr const char* kBertPaddingMask = "padding_mask";
inline constexpr const char* kBertIsRandom = "is_random";
inline constexpr const char* kClassLabel = "label";

// This rank's BERT chunks (pretraining heads, or a classifier's with num_classes > 0); refuses
// the layouts BERT has no form for (context parallelism, MoE, --reset-attention-mask).
std::vector<std::unique_ptr<ModelChunk>> build_bert_chunks(const ModelOptions& o,
                                                           const ChunkPlacement& p,
                                                           int64_t num_classes);
// Bytes a micro-batch leaves saved for backward in a BERT chunk (the encoder's layers keep what
// GPT's decoder layers keep; the heads add a few [s, b, h]).
int64_t bert_activation_bytes(const ModelChunk& chunk, const TransformerConfig& cfg,
                              int64_t micro_batch_size);

// The dtype of BERT batch field `name` (refuses another name).
DType bert_batch_field_dtype(const std::string& name);

class BertChunk final : public ModelChunk {
 public:
  BertChunk(const TransformerConfig& cfg, BertStage stage);

  std::unique_ptr<Ctx> new_ctx() const override;
  std::vector<TensorSpec> recv_specs(int64_t micro_batch_size) const override;
  std::vector<TensorSpec> send_specs(int64_t micro_batch_size) const override;
  std::vector<std::string> batch_fields() const override;
  bool is_last() const override { return model_.stage().post_process; }
  TensorMap forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                    const ForwardMode& mode) const override;
  TensorMap backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const override;
  std::vector<Param*> parameters() override { return model_.parameters(); }
  std::vector<Fp8Region*> fp8_regions() override {
    Fp8Region* r = model_.encoder->fp8_region();
    return r ? std::vector<Fp8Region*>{r} : std::vector<Fp8Region*>{};
  }

  BertModel& model() { return model_; }
  const BertModel& model() const { return model_; }

 private:
  struct BertCtx final : Ctx {
    BertModel::Ctx model;
  };
  BertModel model_;
};

// pretrain_bert.py's loss, per micro-batch:
//   lm loss  = sum(token loss x loss_mask) / sum(loss_mask)
//   sop loss = mean over the sequences of the sentence-order cross entropy (binary head)
// and the objective lm loss + sop loss, divided by the number of micro-batches (Megatron's
// legacy two-value loss_func: each micro-batch's means, averaged). Logged: "lm loss" and
// "sop loss", averaged over micro-batches and data-parallel ranks as Megatron does.
// --calculate-per-token-loss is refused: pretrain_bert has no per-token form.
// The sentence-order term exists when the last chunk outputs it (the binary head).
// Megatron's finetuning loss (tasks/finetune_utils.py): the cross entropy of the class logits,
// the mean over the micro-batch's samples (padding samples, label -1, excluded), logged under
// Megatron's name "lm loss"; plus "accuracy", correct / counted samples (summed over
// micro-batches and data-parallel ranks: the accuracy of the whole evaluation).
class ClassificationLoss final : public LossFn {
 public:
  LossTerms forward(const TensorMap& out, const TensorMap& batch, const ObjectiveScale& scale,
                    TensorMap* dout) const override;
};

class BertLoss final : public LossFn {
 public:
  LossTerms forward(const TensorMap& out, const TensorMap& batch, const ObjectiveScale& scale,
                    TensorMap* dout) const override;
};

}  // namespace megatron
