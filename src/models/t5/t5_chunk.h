// T5 as the trainer sees it: T5Chunk, the whole T5Model as one ModelChunk (T5 has no pipeline
// stages), whose per-token loss goes to GPTLoss (pretrain_t5.py reuses pretrain_gpt's loss_func:
// the masked sum and its token count, "lm loss").
//
// Batch fields, pretrain_t5.py's get_batch names: "text_enc" [b, s_enc] i64, "text_dec",
// "labels" [b, s_dec] i64, "loss_mask" [b, s_dec] f32, "enc_mask" [b, s_enc] and "dec_mask"
// [b, s_dec] i32 (1 for real tokens, 0 for padding).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/model_chunk.h"
#include "models/model_spec.h"
#include "models/t5/t5_model.h"

namespace megatron {

inline constexpr const char* kT5TextEnc = "text_enc";
inline constexpr const char* kT5TextDec = "text_dec";
inline constexpr const char* kT5EncMask = "enc_mask";
inline constexpr const char* kT5DecMask = "dec_mask";

// The spec (shape, dtype) of T5 batch field `name` (refuses another name).
TensorSpec t5_batch_field(const std::string& name, int64_t b, const TransformerConfig& cfg);

// This rank's T5 chunk (one); refuses pipeline stages, context parallelism and MoE.
std::vector<std::unique_ptr<ModelChunk>> build_t5_chunks(const ModelOptions& o,
                                                         const ChunkPlacement& p);

// Bytes a micro-batch leaves saved for backward (the encoder's layers at s_enc, the decoder's at
// s_dec with their cross-attention, the logits).
int64_t t5_activation_bytes(const ModelChunk& chunk, const TransformerConfig& cfg,
                            int64_t micro_batch_size);

class T5Chunk final : public ModelChunk {
 public:
  T5Chunk(const TransformerConfig& cfg, std::shared_ptr<ProcessGroup> tp, bool sequence_parallel,
          ProcessGroup* amax = nullptr);

  std::unique_ptr<Ctx> new_ctx() const override;
  std::vector<TensorSpec> recv_specs(int64_t) const override { return {}; }
  std::vector<TensorSpec> send_specs(int64_t) const override { return {}; }
  std::vector<std::string> batch_fields() const override;
  bool is_last() const override { return true; }
  TensorMap forward(const TensorMap& in, const TensorMap& batch, Ctx& ctx,
                    const ForwardMode& mode) const override;
  TensorMap backward(const TensorMap& dout, Ctx& ctx, const ParamsDone& done) const override;
  std::vector<Param*> parameters() override { return model_.parameters(); }
  std::vector<SelfAttention*> decoder_self_attentions() override {
    return model_.decoder->self_attentions();
  }
  std::vector<Fp8Region*> fp8_regions() override {
    std::vector<Fp8Region*> out;
    for (Fp8Region* r : {model_.encoder->fp8_region(), model_.decoder->fp8_region()})
      if (r) out.push_back(r);
    return out;
  }

  T5Model& model() { return model_; }
  const T5Model& model() const { return model_; }

 private:
  struct T5Ctx final : Ctx {
    T5Model::Ctx model;
  };
  T5Model model_;
};

}  // namespace megatron
