// BERT <-> Hugging Face names and layouts: see the header.
#include "models/bert/bert_hf.h"

#include <filesystem>
#include <set>

#include "checkpoint/safetensors_dir.h"
#include "models/common/hf_tensors.h"

namespace megatron {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kPostLnArch = "BertForPreTraining";
constexpr const char* kPreLnArch = "MegatronBertForPreTraining";

std::vector<HfTensorMapping> build_mappings(BertModel& m) {
  const TransformerConfig& c = m.config();
  const int64_t h = c.hidden_size, ffn = c.ffn_hidden_size, V = c.vocab_size;
  const int64_t qkv = c.num_attention_heads * c.head_dim();
  const bool post = c.post_layernorm;
  MEGATRON_CHECK(m.embedding && m.pooler && (m.head || m.classification_head),
                 "BERT's Hugging Face mapping needs the whole model with its pooler");
  std::vector<HfTensorMapping> maps;
  auto add = [&](const std::string& name, Param& p, Shape shape, std::vector<int64_t> rows = {}) {
    maps.push_back(HfTensorMapping{name, &p, 0, std::move(rows), false, shape, 0.0});
  };
  auto norm = [&](const std::string& name, Norm& n) {
    add(name + ".weight", n.weight, {h});
    add(name + ".bias", n.bias, {h});
  };
  LanguageEmbedding& e = *m.embedding;
  add("bert.embeddings.word_embeddings.weight", e.word_embeddings, {V, h});
  add("bert.embeddings.position_embeddings.weight", e.position_embeddings,
      {c.max_position_embeddings, h});
  add("bert.embeddings.token_type_embeddings.weight", e.tokentype_embeddings, {2, h});
  if (post) norm("bert.embeddings.LayerNorm", *e.layernorm);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    TransformerLayer& L = *m.encoder->layers[static_cast<size_t>(i)];
    const std::string p = "bert.encoder.layer." + std::to_string(i) + ".";
    const char* parts[] = {"query", "key", "value"};
    for (int part = 0; part < 3; ++part) {
      const std::vector<int64_t> rows = packed_qkv_rows(c, part);
      add(p + "attention.self." + parts[part] + ".weight", L.self_attention->linear_qkv->weight(),
          {qkv, h}, rows);
      add(p + "attention.self." + parts[part] + ".bias", L.self_attention->linear_qkv->bias(),
          {qkv}, rows);
    }
    add(p + "attention.output.dense.weight", L.self_attention->linear_proj.weight(), {h, qkv});
    add(p + "attention.output.dense.bias", L.self_attention->linear_proj.bias, {h});
    norm(p + (post ? "attention.output.LayerNorm" : "attention.ln"), *L.input_layernorm);
    add(p + "intermediate.dense.weight", L.mlp->linear_fc1.weight(), {ffn, h});
    add(p + "intermediate.dense.bias", L.mlp->linear_fc1.bias(), {ffn});
    add(p + "output.dense.weight", L.mlp->linear_fc2.weight(), {h, ffn});
    add(p + "output.dense.bias", L.mlp->linear_fc2.bias, {h});
    norm(p + (post ? "output.LayerNorm" : "ln"), *L.pre_mlp_layernorm);
  }
  if (!post) norm("bert.encoder.ln", m.encoder->final_layernorm);
  add("bert.pooler.dense.weight", m.pooler->dense.weight, {h, h});
  add("bert.pooler.dense.bias", m.pooler->dense.bias, {h});
  if (!m.head) return maps;  // a classifier: its head is not in a pretraining directory
  add("cls.predictions.transform.dense.weight", m.lm_dense->weight, {h, h});
  add("cls.predictions.transform.dense.bias", m.lm_dense->bias, {h});
  norm("cls.predictions.transform.LayerNorm", *m.lm_norm);
  add("cls.predictions.bias", m.head->bias, {V});
  if (c.untie_embeddings_and_output_weights)
    add("cls.predictions.decoder.weight", m.head->own_weight, {V, h});
  add("cls.seq_relationship.weight", m.binary_head->weight, {2, h});
  add("cls.seq_relationship.bias", m.binary_head->bias, {2});
  return maps;
}

}  // namespace

BertHfInfo read_bert_hf_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  BertHfInfo info;
  info.raw = read_hf_config_json(dir);
  const json& j = info.raw;
  const std::string type = hf_get<std::string>(j, "model_type", file);
  MEGATRON_CHECK(type == "bert" || type == "megatron-bert", file, ": model_type '", type,
                 "' is not BERT (bert or megatron-bert)");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    const std::string arch = j["architectures"][0].get<std::string>();
    MEGATRON_CHECK(arch == kPostLnArch || arch == kPreLnArch, file, ": architecture ", arch,
                   " is not supported; BERT directories load as ", kPostLnArch, " or ", kPreLnArch,
                   " (the pretraining heads Megatron's BERT has)");
  }
  TransformerConfig& c = info.config;
  c.hidden_dropout = hf_get_or<double>(j, "hidden_dropout_prob", 0.1, file);
  c.attention_dropout = hf_get_or<double>(j, "attention_probs_dropout_prob", 0.1, file);
  c.num_layers = hf_get<int64_t>(j, "num_hidden_layers", file);
  c.hidden_size = hf_get<int64_t>(j, "hidden_size", file);
  c.num_attention_heads = hf_get<int64_t>(j, "num_attention_heads", file);
  c.ffn_hidden_size = hf_get<int64_t>(j, "intermediate_size", file);
  c.max_position_embeddings = hf_get<int64_t>(j, "max_position_embeddings", file);
  c.vocab_size = hf_get<int64_t>(j, "vocab_size", file);
  c.norm_epsilon = hf_get_or<double>(j, "layer_norm_eps", 1e-12, file);
  const std::string act = hf_get_or<std::string>(j, "hidden_act", "gelu", file);
  MEGATRON_CHECK(act == "gelu" || act == "gelu_new", file, ": hidden_act '", act,
                 "' is not supported (gelu, gelu_new)");
  c.openai_gelu = act == "gelu_new";
  MEGATRON_CHECK(hf_get_or<int64_t>(j, "type_vocab_size", 2, file) == 2, file,
                 ": type_vocab_size must be 2 (sentences A and B), as Megatron's BERT has");
  MEGATRON_CHECK(
      hf_get_or<std::string>(j, "position_embedding_type", "absolute", file) == "absolute", file,
      ": only absolute position embeddings are supported");
  c.normalization = Normalization::kLayerNorm;
  c.position_embedding = PositionEmbedding::kLearnedAbsolute;
  c.add_bias_linear = true;
  c.untie_embeddings_and_output_weights = !hf_get_or<bool>(j, "tie_word_embeddings", true, file);
  c.post_layernorm = type == "bert";
  c.bert_binary_head = true;
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string())
    info.dtype = hf_dtype_from_torch(j["torch_dtype"].get<std::string>(), file);
  return info;
}

void check_bert_exportable(const TransformerConfig& c) {
  MEGATRON_CHECK(c.position_embedding == PositionEmbedding::kLearnedAbsolute &&
                     c.normalization == Normalization::kLayerNorm && !c.swiglu && !c.squared_relu &&
                     !c.gated_gelu && c.softmax_scale == 0 && c.add_bias_linear &&
                     !c.qk_layernorm && !c.layernorm_zero_centered_gamma && !c.moe.enabled() &&
                     c.num_query_groups == c.num_attention_heads &&
                     c.head_dim() * c.num_attention_heads == c.hidden_size && c.bert_binary_head,
                 "this BERT has no Hugging Face form: BertForPreTraining needs learned absolute "
                 "positions, LayerNorm, GELU, linear biases, no --qk-layernorm, "
                 "--apply-layernorm-1p, MoE, --group-query-attention, --kv-channels, "
                 "--gated-linear-unit or --softmax-scale, and the "
                 "binary head (no --bert-no-binary-head)");
}

BertHfInfo bert_hf_info_from_config(const TransformerConfig& c) {
  check_bert_exportable(c);
  BertHfInfo info;
  info.config = c;
  const bool post = c.post_layernorm;
  info.raw = json{{"model_type", post ? "bert" : "megatron-bert"},
                  {"architectures", json::array({post ? kPostLnArch : kPreLnArch})},
                  {"vocab_size", c.vocab_size},
                  {"hidden_size", c.hidden_size},
                  {"num_hidden_layers", c.num_layers},
                  {"num_attention_heads", c.num_attention_heads},
                  {"intermediate_size", c.ffn_hidden_size},
                  {"hidden_act", c.openai_gelu ? "gelu_new" : "gelu"},
                  {"hidden_dropout_prob", c.hidden_dropout},
                  {"attention_probs_dropout_prob", c.attention_dropout},
                  {"max_position_embeddings", c.max_position_embeddings},
                  {"type_vocab_size", 2},
                  {"layer_norm_eps", c.norm_epsilon},
                  {"pad_token_id", 0},
                  {"position_embedding_type", "absolute"},
                  {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
                  {"torch_dtype", "float32"}};
  return info;
}

namespace {

// strict: every tensor of the directory must map (a pretraining model); else the pretraining
// heads (cls.*) may be left over (a classifier starting from a pretrained BERT).
void load_mapped(const std::string& dir, const BertHfInfo& info, BertModel& model, ParamSet& params,
                 bool strict) {
  auto st = safetensors::SafetensorsDir::open(dir);
  std::map<Param*, Tensor> staged;
  for (Param* p : params.params()) staged[p] = Tensor::zeros(p->shape, DType::kF64);
  std::set<std::string> used;
  for (const HfTensorMapping& mp : build_mappings(model)) {
    MEGATRON_CHECK(st.contains(mp.hf_name), dir, ": tensor '", mp.hf_name,
                   "' is missing from the safetensors files; config.json and the weights disagree");
    used.insert(mp.hf_name);
    const auto& ti = st.info(mp.hf_name);
    MEGATRON_CHECK(ti.shape == mp.hf_shape, dir, ": tensor '", mp.hf_name, "' has shape ",
                   ti.shape.str(), ", config.json implies ", mp.hf_shape.str());
    Tensor src = st.read(mp.hf_name).to(DType::kF64);
    copy_mapped(mp, src.data<double>(), staged.at(mp.param).data<double>(), true);
  }
  const bool tied = !info.config.untie_embeddings_and_output_weights;
  for (const std::string& name : st.names()) {
    if (used.count(name)) continue;
    // Tied copies (the decoder is the word embeddings, its bias cls.predictions.bias) and the
    // id buffers older files carry.
    const bool tied_copy = (tied && name == "cls.predictions.decoder.weight") ||
                           name == "cls.predictions.decoder.bias";
    const bool buffer =
        name == "bert.embeddings.position_ids" || name == "bert.embeddings.token_type_ids";
    const bool head = !strict && name.rfind("cls.", 0) == 0;
    MEGATRON_CHECK(tied_copy || buffer || head, dir, ": unexpected tensor '", name, "' for a ",
                   info.config.post_layernorm ? kPostLnArch : kPreLnArch,
                   " as config.json describes it");
  }
  // Parameters no tensor maps to (a classifier's head) keep their initialisation.
  std::set<Param*> mapped;
  for (const HfTensorMapping& mp : build_mappings(model)) mapped.insert(mp.param);
  for (auto& [p, t] : staged)
    if (mapped.count(p)) params.set_main(*p, t);
  params.sync_compute_from_main();
}

}  // namespace

void load_bert_hf_weights(const std::string& dir, const BertHfInfo& info, BertModel& model,
                          ParamSet& params) {
  load_mapped(dir, info, model, params, /*strict=*/true);
}

void load_bert_hf_encoder(const std::string& dir, const BertHfInfo& info, BertModel& model,
                          ParamSet& params) {
  load_mapped(dir, info, model, params, /*strict=*/false);
}

std::map<std::string, Tensor> bert_hf_tensors(const BertModel& model, bool grads) {
  // Mappings take non-const Params; nothing is written through them here.
  return mapped_hf_tensors(build_mappings(const_cast<BertModel&>(model)), grads);
}

void save_bert_hf(const std::string& dir, const BertHfInfo& info, const BertModel& model) {
  check_bert_exportable(model.config());
  write_hf_dir(dir, bert_hf_tensors(model, false), info.dtype, info.raw);
}

}  // namespace megatron
