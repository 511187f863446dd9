// Hugging Face LlavaForConditionalGeneration directories (a CLIP vision tower, the multimodal
// projector and a Llama text model) <-> LlavaModel.
//
// config.json: model_type "llava" with text_config (a Llama config; keys it omits take
// LlamaConfig's defaults, as transformers fills them) and vision_config (a CLIP vision config,
// CLIPVisionConfig's defaults likewise). The vision encoder keeps the layers LLaVA reads its
// features from: vision_feature_layer -2 (the default) uses all but the last layer, as
// Megatron's CLIP config does (23 of CLIP ViT-L's 24); vision_feature_select_strategy "default"
// drops the class token (--disable-vision-class-token), "full" keeps it. The projector is
// linear_1 -> GELU -> linear_2 with biases (--vision-projection-type mlp, width = the text
// hidden size).
//
// Tensors: both of transformers' namings load (vision_tower.vision_model.*,
// multi_modal_projector.*, language_model.model.* / language_model.lm_head.weight as on the Hub,
// and the model.vision_tower.* / model.language_model.* / lm_head.weight of transformers 4.52 and
// later); the export writes the first. CLIP's q, k and v projections pack into linear_qkv as a
// GPT's do; the patch embedding's Conv2d weight [h, 3, p, p] is conv1's [h, 3 p p] in the same
// order; class_embedding [h] is the class token. Tensors the model does not use (the tower's
// post_layernorm, layers after the feature layer) are skipped on import and, when exporting with
// the source directory, copied from it unchanged, so import -> export reproduces every file tensor.
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "models/llava/llava_model.h"
#include "models/model_spec.h"

namespace megatron {

struct LlavaHfInfo {
  TransformerConfig config;  // the language model's with its `vision` part
  DType dtype = DType::kF32;
  nlohmann::json raw;                 // config.json as read (or as it will be written)
  int64_t vision_layers_in_file = 0;  // vision_config.num_hidden_layers
};

LlavaHfInfo read_llava_hf_config(const std::string& dir);
// config.json for a model trained here: every key written out, vision_feature_layer -1.
LlavaHfInfo llava_hf_info_from_config(const TransformerConfig& cfg);
// Refuses (naming the flags) what LlavaForConditionalGeneration cannot hold.
void check_llava_exportable(const TransformerConfig& cfg);

void load_llava_hf_weights(const std::string& dir, const LlavaHfInfo& info, LlavaModel& model,
                           ParamSet& params);
// The whole model's weights (grads = false) or gradients under HF's names (Hub naming), f64.
std::map<std::string, Tensor> llava_to_hf_tensors(const LlavaHfInfo& info, const LlavaModel& model,
                                                  bool grads);
// source_dir: the directory the weights came from ("" for none): its unused tensors are copied.
void save_llava_hf(const std::string& dir, const LlavaHfInfo& info, const LlavaModel& model,
                   const std::string& source_dir);

// A Hugging Face CLIP directory's vision tower (CLIPVisionModel: vision_model.*; CLIPModel: its
// vision_config and vision_model.*; a LLaVA directory's vision tower too) into the vision
// encoder of `model` (its first stage): Megatron's combine step, with the language model from
// --pretrained-checkpoint. The tower's sizes must equal the encoder's (errors name the flag to
// set); its first --encoder-num-layers layers are read.
void load_clip_vision_weights(const std::string& dir, LlavaModel& model, ParamSet& params);

HfMapping llava_hf_mapping();

}  // namespace megatron
