// Hugging Face BERT directories: BertForPreTraining (the original post-LN BERT, model_type
// "bert") and MegatronBertForPreTraining (Megatron's pre-LN layout, "megatron-bert"), imported
// into a whole BertModel and exported back.
//
// config.json -> our config: num_hidden_layers, hidden_size, num_attention_heads,
// intermediate_size, max_position_embeddings, vocab_size, layer_norm_eps, hidden_act (gelu: erf,
// gelu_new: --openai-gelu), tie_word_embeddings; "bert" sets --transformer-block-type post_ln.
// Tensors: bert.embeddings.{word,position,token_type}_embeddings (+ .LayerNorm post-LN);
// per layer attention.self.{query,key,value} (packed per head into linear_qkv),
// attention.output.dense, intermediate.dense, output.dense and the norms (post-LN:
// attention.output.LayerNorm, output.LayerNorm; pre-LN: attention.ln, ln; and bert.encoder.ln);
// bert.pooler.dense, cls.predictions.transform.{dense,LayerNorm}, cls.predictions.bias,
// cls.seq_relationship. The decoder weight is the word embeddings (tied): written once, as
// save_pretrained does; a file that repeats it as cls.predictions.decoder.weight loads too, and
// the position/token-type id buffers of older files are skipped.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "models/bert/bert_model.h"
#include "parallel/param.h"

namespace megatron {

struct BertHfInfo {
  TransformerConfig config;  // padded_vocab_size left to the caller
  DType dtype = DType::kF32;
  nlohmann::json raw;  // config.json as read
};

BertHfInfo read_bert_hf_config(const std::string& dir);
// Refuses (naming the flags) a config no HF BERT architecture holds.
void check_bert_exportable(const TransformerConfig& cfg);
// config.json for a model trained here.
BertHfInfo bert_hf_info_from_config(const TransformerConfig& cfg);

void load_bert_hf_weights(const std::string& dir, const BertHfInfo& info, BertModel& model,
                          ParamSet& params);
// A classifier (num_classes > 0) from a pretraining directory: embeddings, encoder and pooler;
// the pretraining heads are skipped and the classification head keeps its initialisation.
void load_bert_hf_encoder(const std::string& dir, const BertHfInfo& info, BertModel& model,
                          ParamSet& params);
void save_bert_hf(const std::string& dir, const BertHfInfo& info, const BertModel& model);
// Weights (grads = false) or gradients under HF names and shapes, f64, padding rows dropped.
std::map<std::string, Tensor> bert_hf_tensors(const BertModel& model, bool grads);

}  // namespace megatron
