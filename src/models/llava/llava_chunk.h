// LLaVA as the trainer sees it: LlavaChunk, one pipeline stage of a LlavaModel.
//
// Stages pass "hidden" ([S', b, h] f32) as GPT's do. The first stage reads the batch's "tokens"
// and "position_ids" ([b, T], the text with its image tokens) and "images" ([b, 3, img_h, img_w]:
// one image per sample, Megatron's pretrain_vlm layout); the last reads "labels" and "loss_mask"
// ([b, S], already spliced by the batch maker) and returns "per-token loss" [b, S], which GPTLoss
// weighs by the loss mask (Megatron's pretrain_vlm uses pretrain_gpt's loss_func).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/llava/llava_model.h"
#include "models/model_chunk.h"

namespace megatron {

inline constexpr const char* kImages = "images";

class LlavaChunk final : public ModelChunk {
 public:
  LlavaChunk(const TransformerConfig& cfg, GPTStage stage);

  std::unique_ptr<Ctx> new_ctx() const override;
  std::vector<TensorSpec> recv_specs(int64_t micro_batch_size) const override;
  std::vector<TensorSpec> send_specs(int64_t micro_batch_size) const override;
  std::vector<std::string> batch_fields() const override;
  bool is_last() const override { return model_.stage().post_process; }
  TensorMap forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                    const ForwardMode& mode) const override;
  TensorMap backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const override;
  // Scoring with images: batch "tokens" [b, s] (image tokens included), "images"
  // [n, 3, img_h, img_w]; one pipeline stage, no KV cache (the Generator's cache counts tokens,
  // not the image's positions: generation calls LlavaModel::infer with its own cache). Returns
  // "logits" as LlavaModel::infer.
  TensorMap infer(const TensorMap& in, const TensorMap& batch, const ForwardMode& mode,
                  bool last_only) const override;
  std::vector<Param*> parameters() override { return model_.parameters(); }
  std::vector<SelfAttention*> decoder_self_attentions() override {
    return model_.language_model.decoder->self_attentions();  // the vision tower is an encoder
  }
  std::vector<Fp8Region*> fp8_regions() override {
    Fp8Region* r = model_.language_model.decoder->fp8_region();
    return r ? std::vector<Fp8Region*>{r} : std::vector<Fp8Region*>{};
  }

  LlavaModel& model() { return model_; }
  const LlavaModel& model() const { return model_; }

 private:
  struct LlavaCtx final : Ctx {
    LlavaModel::Ctx model;
  };
  LlavaModel model_;
};

}  // namespace megatron
