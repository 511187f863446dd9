// LlavaModel: Megatron's LLaVAModel, a CLIP vision encoder and a projector feeding a GPT/Llama
// decoder; or, in a pipeline, one stage of it.
//
// The first pipeline stage holds the vision encoder and the projector (Megatron r0.14:
// add_encoder = is_pipeline_first_stage) besides the language model's embedding and first layers:
//
//   images [n, 3, img_h, img_w] -> ClipVisionModel -> [seq_v, n, h_v]
//     -> (class token dropped with --disable-vision-class-token) -> VisionProjection
//     -> image embeddings [img_seq, n, h]
//   tokens [b, T] (one image token, id -200, per image) -> the image tokens read as id 0 ->
//     the language embedding at the batch's text positions -> text embeddings [T, b, h]
//   decoder input [S, b, h]: text and image embeddings spliced as models/llava/image_splice
//     places them (each image token replaced by its image's img_seq embeddings), zeros after a
//     sample's end, S = the language model's --seq-length (the combined length, fixed so that
//     every pipeline stage sees one shape); split over the sequence-parallel group after
//     splicing, as Megatron does.
//
// The rest is GPT's (GPTModel with the spliced decoder input): the later stages are plain GPT
// stages and the last one's per-token loss is over the combined sequence, whose labels and loss
// mask the batch carries already spliced (models/llava/llava_data.h). Language-model parameters
// keep GPT's names, so a GPT checkpoint is a LLaVA language model (Megatron's combine step);
// the vision parts are vision_model.* and vision_projection.*.
//
// Splicing is one row gather: the text embeddings, the image embeddings and a zero row stacked
// into one table, and the decoder input's rows looked up in it by index (ops::embedding_forward);
// backward scatters the decoder input's gradient back with ops::embedding_backward.
#pragma once

#include <memory>

#include "transformer/kv_cache.h"

#include "models/gpt/gpt_model.h"
#include "models/vision/clip_vit.h"
#include "models/vision/vision_projection.h"

namespace megatron {

struct LlavaInputs {
  Tensor tokens;     // [b, T] i64, image tokens included (first stage)
  Tensor positions;  // [b, T] i64 text positions, or undefined: 0..T-1 (first stage)
  Tensor images;     // [n, 3, img_h, img_w] f32, one per image token in order (first stage)
  Tensor labels;     // [b, S] i64 spliced labels (last stage)
};

class LlavaModel {
 public:
  struct Ctx {
    ClipVisionModel::Ctx vision;
    VisionProjection::Ctx projection;
    LanguageEmbedding::Ctx text;
    Tensor source_rows;  // [S b] i64: the stacked table's row of each decoder-input row
    int64_t text_rows = 0, image_rows = 0, n_images = 0;
    std::vector<int64_t> token_end;  // inference: [b, T] each token's last combined position
    GPTModel::Ctx lm;
  };

  LlavaModel(const TransformerConfig& cfg, GPTStage stage);
  LlavaModel(const LlavaModel&) = delete;
  LlavaModel& operator=(const LlavaModel&) = delete;

  // One stage: hidden_in on later stages ([S', b, h]); returns the per-token loss [b, S] on the
  // last stage, else the stage's output.
  Tensor forward_stage(const Tensor& hidden_in, const LlavaInputs& in, Ctx& ctx,
                       const ForwardMode& mode) const;
  Tensor backward_stage(const Tensor& d, Ctx& ctx, const ParamsDone& done = {}) const;

  // The first stage's decoder input [S', b, h] for tokens and images (ctx keeps what backward
  // needs). Training pads every sequence to --seq-length; inference (for_inference) takes the
  // longest combined sequence of the batch and records each token's last position in ctx.
  Tensor decoder_input(const LlavaInputs& in, Ctx& ctx, const ForwardMode& mode,
                       bool for_inference = false) const;

  // Inference in one pipeline stage: logits [s b, Vp] over the whole padded vocabulary at each
  // text token's place (row t b + i: the logits after token t of sequence i; for an image token,
  // after its image's last embedding), or [b, Vp] after the last token. With `cache`, the
  // positions run join it (the caller advances it by *positions, the combined positions this
  // call ran: the image's embeddings count); a call without images continues a cached prompt
  // with text tokens (in.positions: their text positions, which learned position embeddings
  // read; RoPE turns by the cache's combined positions, as in training).
  Tensor infer(const LlavaInputs& in, bool last_only, KvCache* cache = nullptr,
               int64_t* positions = nullptr) const;

  std::vector<Param*> parameters();
  const TransformerConfig& config() const { return language_model.config(); }
  const GPTStage& stage() const { return language_model.stage(); }

  GPTModel language_model;
  std::unique_ptr<ClipVisionModel> vision_model;        // first stage
  std::unique_ptr<VisionProjection> vision_projection;  // first stage

 private:
  void splice_backward(const Tensor& dx, Ctx& ctx, const ParamsDone& done) const;
  void vision_backward(Tensor dvit, Ctx& ctx, const ParamsDone& done) const;
};

}  // namespace megatron
