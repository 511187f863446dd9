// Hugging Face's form of Megatron's hybrid Mamba models: NemotronH (NemotronHForCausalLM,
// model_type "nemotron_h"), the architecture of NVIDIA's Nemotron-H checkpoints, whose
// hybrid_override_pattern is Megatron's layer pattern (M Mamba-2, * attention, - MLP, E MoE;
// transformers 5 writes it as the list layers_block_type, read too). Its multi-token prediction
// layers (mtp.*) are skipped on import, as NemotronHForCausalLM does.
//
// The mapping: backbone.embeddings <-> embedding.word_embeddings; per layer, backbone.layers.i.norm
// <-> the layer's one norm (the Mamba layer's norm, the attention layer's input_layernorm, the MLP
// layer's pre_mlp_layernorm); a Mamba layer's mixer tensors keep their names and layouts
// (in_proj [z | x | B | C | dt], conv1d.weight [channels, 1, d_conv] <-> ours [channels, d_conv]);
// an attention layer's q/k/v_proj pack into Megatron's per-group linear_qkv and o_proj is
// linear_proj; an MLP layer's up_proj / down_proj are linear_fc1 / linear_fc2 (squared ReLU,
// --squared-relu); backbone.norm_f and lm_head (untied by default). NemotronH's attention has no
// positional embedding (--position-embedding-type none) and its norms are RMSNorm with
// layer_norm_epsilon (the gated norm's epsilon too: Megatron's is 1e-5, so other values are
// refused). An MoE layer ('E', NemotronHMoE of Nemotron 3) is DeepSeek-V3's router
// (gate.weight, gate.e_score_correction_bias; models/gpt/deepseek_hf.h) over squared-ReLU experts
// (experts.{e}.up_proj / down_proj <-> the expert's linear_fc1 / linear_fc2) and one shared MLP
// (shared_experts.up_proj / down_proj), the layer's norm its pre_mlp_layernorm. Biases are not
// supported (Megatron's hybrid has none).
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "models/gpt/gpt_model.h"

namespace megatron {

struct NemotronHInfo {
  TransformerConfig config;  // everything config.json fixes; padded_vocab_size left to the caller
  DType dtype = DType::kF32;
  nlohmann::json raw;  // config.json as read
};

// Reads dir/config.json; errors name the file, the key and the fix.
NemotronHInfo read_nemotron_h_config(const std::string& dir);
// Loads dir's weights into a whole model's fp32 main weights (padding rows zero); every tensor
// must be there with its shape and no other tensor may be.
void load_nemotron_h_weights(const std::string& dir, GPTModel& model, ParamSet& params);
// The model's weights or gradients under NemotronH's names and shapes (f64, padding dropped).
std::map<std::string, Tensor> nemotron_h_tensors(const GPTModel& model, bool grads);
// Writes dir (config.json from `source_dir`'s when given, else from the config; weights in
// `dtype`, default the source's or f32). Refuses a model NemotronH cannot hold.
void save_nemotron_h(const std::string& dir, const GPTModel& model, const std::string& source_dir,
                     std::optional<DType> dtype);
// InvalidArgument naming the flags when NemotronH cannot hold the config.
void check_nemotron_h_exportable(const TransformerConfig& cfg);

}  // namespace megatron
