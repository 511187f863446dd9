// T5 <-> Hugging Face names and layouts: see the header.
#include "models/t5/t5_hf.h"

#include <filesystem>
#include <set>

#include "checkpoint/safetensors_dir.h"
#include "models/common/hf_tensors.h"

namespace megatron {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kArch = "T5ForConditionalGeneration";

// Rows of linear_kv ([np, 2, hn] per output row block: each head's key, then its value) that hold
// every key head (part 0) or every value head (1), in head order.
std::vector<int64_t> packed_kv_rows(const TransformerConfig& c, int part) {
  const int64_t np = c.num_attention_heads, hn = c.head_dim();
  std::vector<int64_t> rows;
  for (int64_t head = 0; head < np; ++head)
    for (int64_t k = 0; k < hn; ++k) rows.push_back((head * 2 + part) * hn + k);
  return rows;
}

std::vector<HfTensorMapping> build_mappings(T5Model& m) {
  const TransformerConfig& c = m.config();
  const int64_t h = c.hidden_size, ffn = c.ffn_hidden_size, V = c.vocab_size;
  const int64_t inner = c.num_attention_heads * c.head_dim();
  const bool gated = c.gated_mlp();
  std::vector<HfTensorMapping> maps;
  auto add = [&](const std::string& name, Param& p, Shape shape, std::vector<int64_t> rows = {},
                 int64_t row_begin = 0) {
    maps.push_back(HfTensorMapping{name, &p, row_begin, std::move(rows), false, shape, 0.0});
  };
  add("shared.weight", m.embedding->word_embeddings, {V, h});
  add("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
      m.encoder_relative_pos_emb->weight,
      {c.relative_attention_num_buckets, c.num_attention_heads});
  add("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
      m.decoder_relative_pos_emb->weight,
      {c.relative_attention_num_buckets, c.num_attention_heads});
  auto mlp = [&](const std::string& p, TransformerLayer& L) {
    if (gated) {
      add(p + "DenseReluDense.wi_0.weight", L.mlp->linear_fc1.weight(), {ffn, h}, {}, 0);
      add(p + "DenseReluDense.wi_1.weight", L.mlp->linear_fc1.weight(), {ffn, h}, {}, ffn);
    } else {
      add(p + "DenseReluDense.wi.weight", L.mlp->linear_fc1.weight(), {ffn, h});
    }
    add(p + "DenseReluDense.wo.weight", L.mlp->linear_fc2.weight(), {h, ffn});
  };
  auto self_attention = [&](const std::string& p, TransformerLayer& L) {
    const char* parts[] = {"q", "k", "v"};
    for (int part = 0; part < 3; ++part)
      add(p + "SelfAttention." + parts[part] + ".weight", L.self_attention->linear_qkv->weight(),
          {inner, h}, packed_qkv_rows(c, part));
    add(p + "SelfAttention.o.weight", L.self_attention->linear_proj.weight(), {h, inner});
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    TransformerLayer& L = *m.encoder->layers[static_cast<size_t>(i)];
    const std::string p = "encoder.block." + std::to_string(i) + ".layer.";
    self_attention(p + "0.", L);
    add(p + "0.layer_norm.weight", L.input_layernorm->weight, {h});
    mlp(p + "1.", L);
    add(p + "1.layer_norm.weight", L.pre_mlp_layernorm->weight, {h});
  }
  add("encoder.final_layer_norm.weight", m.encoder->final_layernorm.weight, {h});
  for (size_t i = 0; i < m.decoder->layers.size(); ++i) {
    TransformerLayer& L = *m.decoder->layers[i];
    const std::string p = "decoder.block." + std::to_string(i) + ".layer.";
    self_attention(p + "0.", L);
    add(p + "0.layer_norm.weight", L.input_layernorm->weight, {h});
    CrossAttention& x = *L.cross_attention;
    add(p + "1.EncDecAttention.q.weight", x.linear_q.weight(), {inner, h});
    add(p + "1.EncDecAttention.k.weight", x.linear_kv.weight(), {inner, h}, packed_kv_rows(c, 0));
    add(p + "1.EncDecAttention.v.weight", x.linear_kv.weight(), {inner, h}, packed_kv_rows(c, 1));
    add(p + "1.EncDecAttention.o.weight", x.linear_proj.weight(), {h, inner});
    add(p + "1.layer_norm.weight", L.pre_cross_attn_layernorm->weight, {h});
    mlp(p + "2.", L);
    add(p + "2.layer_norm.weight", L.pre_mlp_layernorm->weight, {h});
  }
  add("decoder.final_layer_norm.weight", m.decoder->final_layernorm.weight, {h});
  add("lm_head.weight", m.head->own_weight, {V, h});
  return maps;
}

}  // namespace

T5HfInfo read_t5_hf_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  T5HfInfo info;
  info.raw = read_hf_config_json(dir);
  const json& j = info.raw;
  const std::string type = hf_get<std::string>(j, "model_type", file);
  MEGATRON_CHECK(type == "t5", file, ": model_type '", type, "' is not T5");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    const std::string arch = j["architectures"][0].get<std::string>();
    MEGATRON_CHECK(arch == kArch, file, ": architecture ", arch, " is not supported; T5 loads as ",
                   kArch);
  }
  MEGATRON_CHECK(!hf_get_or<bool>(j, "tie_word_embeddings", true, file), file,
                 ": tie_word_embeddings is true (the original T5: its decoder output is scaled by "
                 "d_model^-0.5 into a head shared with the embeddings, which Megatron's T5 has no "
                 "form for); T5 v1.1 / flan-t5 directories (untied) load");
  TransformerConfig& c = info.config;
  c.num_layers = hf_get<int64_t>(j, "num_layers", file);
  c.decoder_num_layers = hf_get_or<int64_t>(j, "num_decoder_layers", c.num_layers, file);
  c.hidden_size = hf_get<int64_t>(j, "d_model", file);
  c.kv_channels = hf_get<int64_t>(j, "d_kv", file);
  c.ffn_hidden_size = hf_get<int64_t>(j, "d_ff", file);
  c.num_attention_heads = hf_get<int64_t>(j, "num_heads", file);
  c.vocab_size = hf_get<int64_t>(j, "vocab_size", file);
  c.relative_attention_num_buckets =
      hf_get_or<int64_t>(j, "relative_attention_num_buckets", 32, file);
  c.relative_attention_max_distance =
      hf_get_or<int64_t>(j, "relative_attention_max_distance", 128, file);
  c.norm_epsilon = hf_get_or<double>(j, "layer_norm_epsilon", 1e-6, file);
  c.hidden_dropout = c.attention_dropout = hf_get_or<double>(j, "dropout_rate", 0.1, file);
  const std::string ff = hf_get_or<std::string>(j, "feed_forward_proj", "relu", file);
  if (ff == "gated-gelu") {  // HF runs gelu_new (tanh) for it
    c.gated_gelu = true;
    c.openai_gelu = true;
  } else if (ff == "gated-silu") {
    c.swiglu = true;
  } else if (ff == "gelu") {
    c.openai_gelu = false;
  } else {
    MEGATRON_CHECK(false, file, ": feed_forward_proj '", ff,
                   "' is not supported (gated-gelu, gated-silu, gelu)");
  }
  // No position table (relative buckets); n_positions, where older configs have it, is the
  // length the model was trained at, the default --seq-length.
  c.max_position_embeddings = hf_get_or<int64_t>(j, "n_positions", 512, file);
  c.normalization = Normalization::kRMSNorm;
  c.position_embedding = PositionEmbedding::kRelative;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  c.softmax_scale = 1.0;
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string())
    info.dtype = hf_dtype_from_torch(j["torch_dtype"].get<std::string>(), file);
  return info;
}

void check_t5_exportable(const TransformerConfig& c) {
  const bool mlp_ok = (c.gated_gelu && c.openai_gelu) || c.swiglu ||
                      (!c.gated_mlp() && !c.openai_gelu && !c.squared_relu);
  MEGATRON_CHECK(c.position_embedding == PositionEmbedding::kRelative &&
                     c.normalization == Normalization::kRMSNorm && !c.add_bias_linear &&
                     !c.add_qkv_bias && c.untie_embeddings_and_output_weights && mlp_ok &&
                     c.softmax_scale == 1.0 && !c.qk_layernorm &&
                     !c.layernorm_zero_centered_gamma && !c.moe.enabled() &&
                     c.num_query_groups == c.num_attention_heads,
                 "this T5 has no Hugging Face form: T5ForConditionalGeneration (v1.1) needs "
                 "--position-embedding-type relative, --normalization RMSNorm, "
                 "--disable-bias-linear, --untie-embeddings-and-output-weights, --softmax-scale 1, "
                 "an MLP of --gated-linear-unit --openai-gelu, --swiglu or plain GELU, and no "
                 "--qk-layernorm, --apply-layernorm-1p, MoE or --group-query-attention");
}

T5HfInfo t5_hf_info_from_config(const TransformerConfig& c) {
  check_t5_exportable(c);
  T5HfInfo info;
  info.config = c;
  const TransformerConfig dec = t5_decoder_config(c);
  const char* ff = c.gated_gelu ? "gated-gelu" : c.swiglu ? "gated-silu" : "gelu";
  info.raw = json{{"model_type", "t5"},
                  {"architectures", json::array({kArch})},
                  {"vocab_size", c.vocab_size},
                  {"d_model", c.hidden_size},
                  {"d_kv", c.head_dim()},
                  {"d_ff", c.ffn_hidden_size},
                  {"num_layers", c.num_layers},
                  {"num_decoder_layers", dec.num_layers},
                  {"num_heads", c.num_attention_heads},
                  {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                  {"relative_attention_max_distance", c.relative_attention_max_distance},
                  {"dropout_rate", c.hidden_dropout},
                  {"layer_norm_epsilon", c.norm_epsilon},
                  {"initializer_factor", 1.0},
                  {"feed_forward_proj", ff},
                  {"is_encoder_decoder", true},
                  {"tie_word_embeddings", false},
                  {"use_cache", true},
                  {"pad_token_id", 0},
                  {"eos_token_id", 1},
                  {"decoder_start_token_id", 0},
                  {"torch_dtype", "float32"}};
  return info;
}

void load_t5_hf_weights(const std::string& dir, const T5HfInfo& info, T5Model& model,
                        ParamSet& params) {
  (void)info;
  auto st = safetensors::SafetensorsDir::open(dir);
  std::map<Param*, Tensor> staged;
  for (Param* p : params.params()) staged[p] = Tensor::zeros(p->shape, DType::kF64);
  std::set<std::string> used;
  const std::vector<HfTensorMapping> maps = build_mappings(model);
  for (const HfTensorMapping& mp : maps) {
    MEGATRON_CHECK(st.contains(mp.hf_name), dir, ": tensor '", mp.hf_name,
                   "' is missing from the safetensors files; config.json and the weights disagree");
    used.insert(mp.hf_name);
    const auto& ti = st.info(mp.hf_name);
    MEGATRON_CHECK(ti.shape == mp.hf_shape, dir, ": tensor '", mp.hf_name, "' has shape ",
                   ti.shape.str(), ", config.json implies ", mp.hf_shape.str());
    Tensor src = st.read(mp.hf_name).to(DType::kF64);
    copy_mapped(mp, src.data<double>(), staged.at(mp.param).data<double>(), true);
  }
  for (const std::string& name : st.names()) {
    if (used.count(name)) continue;
    // The embedding's tied copies save_pretrained may write.
    const bool tied_copy =
        name == "encoder.embed_tokens.weight" || name == "decoder.embed_tokens.weight";
    MEGATRON_CHECK(tied_copy, dir, ": unexpected tensor '", name, "' for a ", kArch,
                   " as config.json describes it");
  }
  for (auto& [p, t] : staged) params.set_main(*p, t);
  params.sync_compute_from_main();
}

std::map<std::string, Tensor> t5_hf_tensors(const T5Model& model, bool grads) {
  // Mappings take non-const Params; nothing is written through them here.
  return mapped_hf_tensors(build_mappings(const_cast<T5Model&>(model)), grads);
}

void save_t5_hf(const std::string& dir, const T5HfInfo& info, const T5Model& model) {
  check_t5_exportable(model.config());
  write_hf_dir(dir, t5_hf_tensors(model, false), info.dtype, info.raw);
}

}  // namespace megatron
