// Hugging Face model directories (config.json + safetensors) for GPT-2 and Llama architectures:
// reading the architecture, importing weights into a GPTModel, and exporting them back.
//
// The mapping follows Megatron's layout: GPT-2's Conv1D weights ([in, out]) are transposed to
// [out, in]; QKV projections are packed per query group ([q heads | k | v] for each group), as
// Megatron's linear_qkv is; SwiGLU's gate and up projections are stacked as [gate; up] in
// linear_fc1. Vocabulary padding rows are zero on import and dropped on export, and the export
// writes the dtype the import read, so import -> export reproduces the files' tensors bit for bit.
// This is not our native checkpoint format (sharded, with optimizer state); that is separate.
#pragma once

#include "models/common/hf_tensors.h"  // torch_dtype_name

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "models/gpt/gpt_model.h"

namespace megatron {

enum class HfArch : uint8_t { kGpt2, kLlama };

struct HfModelInfo {
  HfArch arch = HfArch::kGpt2;
  TransformerConfig config;   // everything config.json fixes; padded_vocab_size left to the caller
  DType dtype = DType::kF32;  // dtype of the weights in the files
  nlohmann::json raw;         // config.json as read
  // config.json's model_type ("llama", "mixtral", ...): it names the MLP's tensors.
  std::string model_type;
};

// Reads dir/config.json. Errors name the file, the key and the fix.
HfModelInfo read_hf_config(const std::string& dir);
// The same from a parsed config (a LLaVA config's text_config); `file` names it in errors.
HfModelInfo hf_info_from_json(const nlohmann::json& config, const std::string& file);

// Every HF tensor of a whole model (names without GPT-2's optional "transformer." prefix) and
// where it lives in `model`.
std::vector<HfTensorMapping> hf_tensor_mappings(const HfModelInfo& info, GPTModel& model);

// Loads the weights of dir into the model's fp32 main weights (padding rows zero) and refreshes
// the compute copy. Every expected tensor must be present with the expected shape; unexpected
// tensors are an error too (except GPT-2's causal-mask buffers), so a mismatched file never loads
// half-way.
void load_hf_weights(const std::string& dir, const HfModelInfo& info, GPTModel& model,
                     ParamSet& params);

// Writes dir/config.json and dir/model.safetensors (creating dir) from the main weights, in
// info.dtype, with HF's names and layouts.
void save_hf(const std::string& dir, const HfModelInfo& info, const GPTModel& model);

// The model's weights (grads = false) or gradients (grads = true) under HF names and layouts,
// as f64 tensors (padding rows dropped). Used by save_hf and by the PyTorch oracle tests.
std::map<std::string, Tensor> to_hf_tensors(const HfModelInfo& info, const GPTModel& model,
                                            bool grads);

// The HF architecture that can hold a model of this config: GPT-2 (learned positions, LayerNorm,
// biases, tied) or Llama (RoPE, RMSNorm, SwiGLU, no biases). Error naming the offending flags
// otherwise.
HfArch infer_hf_arch(const TransformerConfig& cfg);

// config.json for a model trained here (no HF source): the HF keys of cfg's architecture.
HfModelInfo hf_info_from_config(const TransformerConfig& cfg, HfArch arch);

}  // namespace megatron
