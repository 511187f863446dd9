// GPT as the trainer sees it: GPTChunk (one pipeline stage of a GPTModel as a ModelChunk) and
// GPTLoss (Megatron's masked mean token loss, "lm loss").
//
// Stages pass one tensor, "hidden" ([s', b, h] f32, s' = s/tp under sequence parallelism). The
// first stage reads the batch's "tokens" and "position_ids", the last "labels" and
// "loss_mask", and every stage "doc_start" with --reset-attention-mask. The last stage's output
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
  // the batch's doc_start.
  GPTChunk(const TransformerConfig& cfg, GPTStage stage, bool documents);

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
  std::vector<Param*> extra_state() override { return model_.decoder->fp8_state(); }

  GPTModel& model() { return model_; }
  const GPTModel& model() const { return model_; }

 private:
  struct GPTCtx final : Ctx {
    GPTModel::Ctx model;
  };
  GPTModel model_;
  bool documents_;
};

class GPTLoss final : public LossFn {
 public:
  // "lm loss": sum over tokens of loss x loss_mask, count = sum of loss_mask. The objective's
  // gradient is loss_mask x loss_scale / (count x micro-batches).
  LossTerms forward(const TensorMap& out, const TensorMap& batch, const ObjectiveScale& scale,
                    TensorMap* dout) const override;
};

}  // namespace megatron
