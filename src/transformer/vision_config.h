// VisionConfig: the vision encoder and projector of a vision-language model (LLaVA), as
// Megatron's pretrain_vlm.py and examples/multimodal configure them. Empty model_type: a text-only
// model. The vision transformer's own TransformerConfig is derived from the language model's by
// vision_transformer_config() (models/vision/clip_vit.h).
#pragma once

#include <cstdint>
#include <string>

namespace megatron {

struct VisionConfig {
  std::string model_type;   // --vision-model-type: "" (no vision encoder) or "clip"
  int64_t num_layers = 0;   // the ViT's layers (--encoder-num-layers, Megatron's pretrain_vlm)
  int64_t hidden_size = 0;  // --vision-hidden-size (0: the language model's, as pretrain_vlm)
  int64_t num_attention_heads = 0;   // --vision-num-attention-heads (0: the language model's)
  int64_t ffn_hidden_size = 0;       // --vision-ffn-hidden-size (0: 4 x the vision hidden size)
  double norm_epsilon = 1e-5;        // CLIP's LayerNorm epsilon
  int64_t patch_dim = 16;            // --patch-dim (Megatron's default)
  int64_t img_h = 224, img_w = 224;  // --img-h, --img-w (Megatron's defaults)
  bool class_token = true;           // false: --disable-vision-class-token (drop it after the ViT)
  std::string projection_type = "mlp";     // --vision-projection-type: mlp or affine
  int64_t projection_ffn_hidden_size = 0;  // --vision-projection-ffn-hidden-size (0: LM hidden)
  // Text tokens per sample, the image token included: --dataloader-seq-length + 1 (Megatron's
  // pretrain_vlm prepends the image token to a text of --dataloader-seq-length tokens).
  int64_t text_seq_length = 0;
  // --freeze-LM, --freeze-ViT (Megatron's LLaVAModel.freeze; the projection is always trained):
  // those weights get no gradient storage and no optimizer state (Param::requires_grad).
  bool freeze_language_model = false, freeze_vision_model = false;

  bool enabled() const { return !model_type.empty(); }
  int64_t grid_h() const { return img_h / patch_dim; }
  int64_t grid_w() const { return img_w / patch_dim; }
  int64_t num_patches() const { return grid_h() * grid_w(); }
  // The ViT's sequence: one class token, then the patches.
  int64_t seq_length() const { return num_patches() + 1; }
  // Embeddings each image puts into the language model's sequence (Megatron's
  // get_num_image_embeddings for CLIP without pixel shuffle or tile tags).
  int64_t num_image_embeddings() const { return num_patches() + (class_token ? 1 : 0); }
};

}  // namespace megatron
