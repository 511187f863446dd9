// GPT as the trainer sees it: GPTChunk (one pipeline stage of a GPTModel as a ModelChunk) and
// GPTLoss (Megatron's masked mean token loss, "lm loss").
//
// Stages pass one tensor, "hidden" ([s', b, h] f32, s' = s/tp under sequence parallelism). The
// first stage reads the batch's "tokens" and "position_ids", the last "labels" and
// "loss_mask", and every stage "doc_start" with --reset-attention-mask (or
// --dataloader-inter-document-masking). The last stage's output
// is "per-token loss" [b, s]; GPTLoss weighs it by the loss mask.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/gpt_batch.h"  // the batch field names
#include "models/gpt/gpt_model.h"
#include "models/model_chunk.h"

namespace megatron {

class GPTChunk final : public ModelChunk {
 public:
  // documents: attention stays inside documents (--reset-attention-mask), so every stage reads
  // the batch's doc_start; packed: they are packed sequences (TokenLayout::packed).
  GPTChunk(const TransformerConfig& cfg, GPTStage stage, bool documents, bool packed = false);

  std::unique_ptr<Ctx> new_ctx() const override;
  std::vector<TensorSpec> recv_specs(int64_t micro_batch_size) const override;
  std::vector<TensorSpec> send_specs(int64_t micro_batch_size) const override;
  std::vector<std::string> batch_fields() const override;
  bool is_last() const override { return model_.stage().post_process; }
  TensorMap forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                    const ForwardMode& mode) const override;
  TensorMap backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const override;
  TensorMap infer(const TensorMap& in, const TensorMap& batch, const ForwardMode& mode,
                  bool last_only) const override;
  std::vector<TensorSpec> infer_specs(int64_t b, int64_t s) const override;
  std::vector<Param*> parameters() override { return model_.parameters(); }
  std::vector<TopKRouter*> moe_routers() override;
  std::vector<SelfAttention*> decoder_self_attentions() override;
  std::vector<Fp8Region*> fp8_regions() override;

  GPTModel& model() { return model_; }
  const GPTModel& model() const { return model_; }

 private:
  struct GPTCtx final : Ctx {
    GPTModel::Ctx model;
  };
  GPTModel model_;
  bool documents_, packed_;
};

class GPTLoss final : public LossFn {
 public:
  GPTLoss() = default;
  // Takes --mtp-num-layers and --mtp-loss-scaling-factor from cfg.
  explicit GPTLoss(const TransformerConfig& cfg)
      : mtp_depths_(cfg.mtp_num_layers), mtp_scale_(cfg.mtp_loss_scaling_factor) {}
  // "lm loss": sum over tokens of loss x loss_mask, count = sum of loss_mask. The objective's
  // gradient is loss_mask x loss_scale / (count x micro-batches).
  // In training with multi-token prediction, depth k's per-token loss ("mtp_k per-token loss")
  // joins the objective as Megatron's MTPLossAutoScaler adds it: its mean over the loss mask
  // rolled left by k (the last k positions out) times --mtp-loss-scaling-factor / depths,
  // scaled like the main loss; logged as "mtp_k loss" (not part of "lm loss").
  LossTerms forward(const TensorMap& out, const TensorMap& batch, const ObjectiveScale& scale,
                    TensorMap* dout) const override;

 private:
  int64_t mtp_depths_ = 0;
  double mtp_scale_ = 0;
};

// The name of multi-token prediction depth k's (1-based) per-token loss among a chunk's outputs.
std::string mtp_loss_name(int64_t k);
// The loss mask rolled left by k over the whole sequence, among the outputs only under context
// parallelism (where rolling needs the other ranks' chunks).
std::string mtp_mask_name(int64_t k);
// With context parallelism, depth k's token count for its mean: the whole sequence's / cp.
std::string mtp_count_name(int64_t k);

}  // namespace megatron
