// Hugging Face's gpt-oss layout (model_type "gpt_oss", GptOssForCausalLM) as Megatron core 0.19's
// flags: what config.json says and where each tensor lives.
//
// Every layer: RMSNorm, attention with biases on q, k, v and o (--add-bias-linear), per-head sinks
// (self_attn.sinks: --softmax-type learnable, core_attention.softmax_offset), YaRN (rope_scaling
// "yarn": --position-embedding-type yarn, its "truncate" the correction range's rounding), and
// sliding_window on the layer_types "sliding_attention" layers (--window-size W-1,0: Hugging Face
// counts the query in the window, Megatron does not; --window-attn-skip-freq as the list of
// layer_types). The MLP is an MoE of num_local_experts experts, top-k over the router's logits
// (router weight and bias) then a softmax over the k (Megatron's default routing), each expert
// quick GeGLU with clamp swiglu_limit and offset 1 (--quick-geglu --glu-linear-offset 1
// --activation-func-clamp-value), with biases.
//
// The experts are stacked tensors: mlp.experts.gate_up_proj [E, h, 2f] (input-major, gate and up
// interleaved column by column: gate j is column 2j, up j column 2j + 1), gate_up_proj_bias
// [E, 2f], down_proj [E, f, h], down_proj_bias [E, h]. OpenAI's published checkpoints keep
// gate_up_proj and down_proj in MXFP4 (quantization_config quant_method "mxfp4"): *_blocks
// [E, rows, G, 16] bytes of two E2M1 values each (low nibble first) along the input dimension,
// *_scales [E, rows, G] E8M0 exponents (bias 127) per 32 values; they load dequantized (exact in
// f32), and export writes the unquantized tensors.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_dir.h"
#include "models/common/hf_tensors.h"
#include "transformer/transformer_layer.h"

namespace megatron {

// config.json (model_type gpt_oss) into c. Errors name the file, the key and why.
void read_gpt_oss_config(const nlohmann::json& j, const std::string& file, TransformerConfig& c);

// Whether cfg uses a piece only gpt-oss has among the Hugging Face layouts (sinks, quick GeGLU,
// YaRN or sliding windows on ordinary attention); then cfg must be a whole gpt-oss model.
bool looks_like_gpt_oss(const TransformerConfig& cfg);
// config.json for cfg; errors name the flags a gpt-oss layout cannot express.
nlohmann::json gpt_oss_config_json(const TransformerConfig& cfg);

// Layer `layer`'s tensors (prefix "model.layers.N."): norms, attention, sinks, router, experts.
void add_gpt_oss_layer_mappings(const TransformerConfig& c, TransformerLayer& layer,
                                const std::string& prefix, std::vector<HfTensorMapping>& maps);

// The MXFP4 experts of a checkpoint that has them: each dequantized tensor's name -> its maker
// (for read_mapped_tensors), and in *parts the blocks and scales names they consume.
HfDerivedTensors gpt_oss_mxfp4_tensors(const safetensors::SafetensorsDir& st,
                                       std::vector<std::string>* parts);
// MXFP4 -> values: blocks [..., rows, G, 16] u8 and scales [..., rows, G] u8 to [..., rows, G 32]
// f32 (the last two dimensions then transposed by the caller where the layout needs it).
Tensor dequantize_mxfp4(const Tensor& blocks, const Tensor& scales);

}  // namespace megatron
