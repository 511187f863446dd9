// ClipVisionModel: Megatron's CLIPViTModel (model_subtype "clip"), the vision encoder of a LLaVA
// model.
//
//   patches  = the image cut into patch_dim x patch_dim squares, row by row, each flattened as
//              (channel, y, x): the stride-patch_dim Conv2d without bias is this GEMM
//   x        = [class token ; patches conv1^T] + position_embeddings      [seq, n, h_v]
//   out      = decoder(ln_pre(x))   (pre-norm layers, bidirectional attention, no final norm)
//
// seq = (img_h / patch_dim) (img_w / patch_dim) + 1; the class token is row 0 of every image,
// the patch rows follow in raster order. Images arrive as [n, 3, img_h, img_w] (the CLIP
// transform's output); activations are [s, b, h] as everywhere here, with the images as the
// batch. The layers are CLIP's (vision_transformer_config): LayerNorm, quick GELU, biases on
// every linear layer, no dropout, and the language model's tensor parallelism (heads and MLP
// features split over TP; conv1, the class token, the positions and ln_pre replicated, their
// gradients identical on every TP rank). No sequence or context parallelism inside the ViT, as in
// Megatron. Parameter names are Megatron's (vision_model.conv1.weight, stored [h_v, 3 p p], the
// Conv2d's [h_v, 3, p, p] in the same memory order; vision_model.class_token [h_v], Megatron's
// [1, 1, h_v] with its one class token).
//
// Initialisation follows Megatron's modules: the class token torch.randn (N(0, 1)), the
// position table nn.Embedding's default N(0, 1); conv1 N(0, --init-method-std) (Megatron keeps
// PyTorch's Conv2d default, a uniform of the same order for CLIP's sizes).
#pragma once

#include <memory>
#include <vector>

#include "parallel/linear.h"
#include "transformer/config.h"
#include "transformer/transformer_block.h"

namespace megatron {

// The ViT's TransformerConfig from the language model's (whose `vision` holds the ViT's sizes):
// CLIP's layer numerics, the LM's initialisation, dtype and recomputation. Errors name the flag.
TransformerConfig vision_transformer_config(const TransformerConfig& lm);

// [n, 3, H, W] images (f32 or f64) -> [(H/p)(W/p) n, 3 p p] patch rows in [s, b] order: row
// t n + i is patch t (raster order) of image i, flattened (channel, y, x).
Tensor unfold_patches(const Tensor& images, int64_t patch_dim);

class ClipVisionModel {
 public:
  struct Ctx {
    int64_t n = 0;
    Linear::Ctx conv1;
    Tensor class_ids, position_ids;  // [1, n] and [seq, n] i64
    Norm::Ctx ln_pre;
    TransformerBlock::Ctx decoder;
  };

  // lm: the language model's config (its `vision` part sizes the ViT); tp: the LM's TP group
  // (sequence parallelism is not used inside the ViT).
  ClipVisionModel(const TransformerConfig& lm, const TensorParallelContext& tp);
  ClipVisionModel(const ClipVisionModel&) = delete;
  ClipVisionModel& operator=(const ClipVisionModel&) = delete;

  // images [n, 3, img_h, img_w] -> [seq, n, h_v] (f32; f64 in f64 models), class token first.
  Tensor forward(const Tensor& images, Ctx& ctx, const ForwardMode& mode) const;
  // dy [seq, n, h_v]: accumulates every parameter's gradient (images get none).
  void backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done = {}) const;

  void collect(std::vector<Param*>& out);
  const TransformerConfig& config() const { return cfg_; }

 private:
  TransformerConfig cfg_;  // before the members that keep references to it

 public:
  Linear conv1;                               // vision_model.conv1.weight [h_v, 3 p p]
  Param class_token;                          // vision_model.class_token [h_v]
  Param position_embeddings;                  // vision_model.position_embeddings.weight [seq, h_v]
  Norm ln_pre;                                // vision_model.ln_pre
  std::unique_ptr<TransformerBlock> decoder;  // vision_model.decoder.layers.*

 private:
  std::vector<const Param*> stem() const;  // conv1, class token, positions, ln_pre
  TensorParallelContext tp_;
  int64_t patch_dim_;
};

}  // namespace megatron
