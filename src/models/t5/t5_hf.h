// Hugging Face T5 directories: T5ForConditionalGeneration in its v1.1 form (google/t5-v1_1-*,
// flan-t5: relative attention, RMSNorm without bias, no linear biases, gated GELU, untied LM
// head), imported into a whole T5Model and exported back.
//
// config.json -> our config: d_model, d_kv (--kv-channels), d_ff, num_layers,
// num_decoder_layers, num_heads, relative_attention_num_buckets and _max_distance,
// layer_norm_epsilon, dropout_rate, vocab_size, feed_forward_proj (gated-gelu: GeGLU with the tanh
// GELU HF uses for it; gated-silu: SwiGLU; gelu: plain erf GELU); always RMSNorm,
// --disable-bias-linear, --position-embedding-type relative, --untie-embeddings-and-output-
// weights and --softmax-scale 1 (HF's T5 does not scale the scores: its initialisation does).
// The tied original T5 (t5-small ...: the decoder output scaled by d_model^-0.5 before a shared
// head without bias) and ReLU MLPs have no form here and are refused.
//
// Tensors: shared.weight (the word embeddings; encoder/decoder.embed_tokens.weight copies load
// too); {encoder,decoder}.block.0.layer.0.SelfAttention.relative_attention_bias.weight (the
// stacks' bias tables); per block SelfAttention.{q,k,v,o} (q, k, v packed per head into
// linear_qkv), EncDecAttention.{q,k,v,o} (k and v packed per head into linear_kv),
// DenseReluDense.{wi_0,wi_1,wo} (wi_0 the gate) or .{wi,wo}, the layer norms in block order
// (layer.0 input, decoder layer.1 cross-attention, last the MLP's), final_layer_norm, lm_head.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "models/t5/t5_model.h"
#include "parallel/param.h"

namespace megatron {

struct T5HfInfo {
  TransformerConfig config;  // padded_vocab_size, seq lengths left to the caller
  DType dtype = DType::kF32;
  nlohmann::json raw;  // config.json as read
};

T5HfInfo read_t5_hf_config(const std::string& dir);
// Refuses (naming the flags) a config T5ForConditionalGeneration cannot hold.
void check_t5_exportable(const TransformerConfig& cfg);
// config.json for a model trained here.
T5HfInfo t5_hf_info_from_config(const TransformerConfig& cfg);

void load_t5_hf_weights(const std::string& dir, const T5HfInfo& info, T5Model& model,
                        ParamSet& params);
void save_t5_hf(const std::string& dir, const T5HfInfo& info, const T5Model& model);
// Weights (grads = false) or gradients under HF names and shapes, f64, padding rows dropped.
std::map<std::string, Tensor> t5_hf_tensors(const T5Model& model, bool grads);

}  // namespace megatron
