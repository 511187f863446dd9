// NemotronH <-> hybrid Mamba GPTModel: config.json, the tensor mapping, load and save.
#include "models/mamba/mamba_hf.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "checkpoint/safetensors_dir.h"
#include "core/logging.h"
#include "models/common/hf_tensors.h"
#include "models/gpt/deepseek_hf.h"

namespace megatron {

namespace {

using Mapping = HfTensorMapping;

std::vector<Mapping> mappings(GPTModel& m) {
  const TransformerConfig& c = m.config();
  const int64_t h = c.hidden_size, hn = c.kv_channels, np = c.num_attention_heads;
  const int64_t ng = c.num_query_groups, ffn = c.ffn_hidden_size, V = c.vocab_size;
  const MambaConfig& mb = c.mamba;
  const int64_t di = mb.d_inner(h), conv = mb.conv_dim(h), heads = mb.heads(h);
  std::vector<Mapping> maps;
  auto add = [&](const std::string& name, Param& p, Shape shape, std::vector<int64_t> rows = {}) {
    maps.push_back(Mapping{name, &p, 0, std::move(rows), false, std::move(shape), 0.0});
  };
  // One layer of either stack: the decoder's backbone.layers.{i}, or an MTP depth's sublayer
  // mtp.layers.{k L + j} (Megatron-Bridge's flattening of
  // mtp.layers.{k}.mtp_model_layer.layers.{j}).
  auto layer_maps = [&](TransformerLayer& L, char type, const std::string& p) {
    const std::string x = p + "mixer.";
    switch (type) {
      case 'M': {
        MambaMixer& mx = *L.mixer;
        add(p + "norm.weight", L.norm->weight, {h});
        add(x + "in_proj.weight", mx.in_proj.weight(), {mb.in_proj_dim(h), h});
        add(x + "conv1d.weight", mx.conv1d_weight, {conv, 1, mb.d_conv});
        add(x + "conv1d.bias", mx.conv1d_bias, {conv});
        add(x + "A_log", mx.A_log, {heads});
        add(x + "D", mx.D, {heads});
        add(x + "dt_bias", mx.dt_bias, {heads});
        add(x + "norm.weight", mx.norm_weight, {di});
        add(x + "out_proj.weight", mx.out_proj.weight(), {h, di});
        break;
      }
      case '*': {
        Param& qkv = L.self_attention->linear_qkv->weight();
        add(p + "norm.weight", L.input_layernorm->weight, {h});
        add(x + "q_proj.weight", qkv, {np * hn, h}, packed_qkv_rows(c, 0));
        add(x + "k_proj.weight", qkv, {ng * hn, h}, packed_qkv_rows(c, 1));
        add(x + "v_proj.weight", qkv, {ng * hn, h}, packed_qkv_rows(c, 2));
        add(x + "o_proj.weight", L.self_attention->linear_proj.weight(), {h, np * hn});
        break;
      }
      case 'E': {  // NemotronHMoE: gate, experts.{e}, shared_experts (up/down, squared ReLU)
        MoELayer& moe = *L.moe;
        const int64_t fe = c.moe.ffn_hidden_size, fs = c.moe.shared_expert_intermediate_size;
        // LatentMoE: the experts at the latent width, between fc1/fc2_latent_proj.
        const int64_t w = c.moe.latent_size > 0 ? c.moe.latent_size : h;
        add(p + "norm.weight", L.pre_mlp_layernorm->weight, {h});
        add_noaux_tc_router_mappings(c, moe, x, maps);
        if (moe.fc1_latent_proj) {
          add(x + "fc1_latent_proj.weight", moe.fc1_latent_proj->weight, {w, h});
          add(x + "fc2_latent_proj.weight", moe.fc2_latent_proj->weight, {h, w});
        }
        for (int64_t e = 0; e < moe.experts.num_local(); ++e) {
          const std::string n =
              x + "experts." + std::to_string(moe.experts.first_expert() + e) + ".";
          add(n + "up_proj.weight", moe.experts.fc1(e), {fe, w});
          add(n + "down_proj.weight", moe.experts.fc2(e), {w, fe});
        }
        if (moe.shared_experts) {
          add(x + "shared_experts.up_proj.weight", moe.shared_experts->linear_fc1.weight(),
              {fs, h});
          add(x + "shared_experts.down_proj.weight", moe.shared_experts->linear_fc2.weight(),
              {h, fs});
        }
        break;
      }
      default:  // '-'
        add(p + "norm.weight", L.pre_mlp_layernorm->weight, {h});
        add(x + "up_proj.weight", L.mlp->linear_fc1.weight(), {ffn, h});
        add(x + "down_proj.weight", L.mlp->linear_fc2.weight(), {h, ffn});
    }
  };
  add("backbone.embeddings.weight", m.embedding->word_embeddings, {V, h});
  for (int64_t i = 0; i < c.num_layers; ++i)
    layer_maps(*m.decoder->layers[static_cast<size_t>(i)], mb.layer_type(i),
               "backbone.layers." + std::to_string(i) + ".");
  add("backbone.norm_f.weight", m.decoder->final_layernorm.weight, {h});
  // Multi-token prediction (Nemotron 3's mtp.*): depth k's sublayers are mtp.layers.{k L + j};
  // the first holds the depth's enorm, hnorm and eh_proj ([embedding | hidden] as Megatron
  // concatenates), the last its final_layernorm.
  if (m.mtp) {
    const auto L = static_cast<int64_t>(mb.mtp_layers.size());
    for (int64_t k = 0; k < static_cast<int64_t>(m.mtp->layers.size()); ++k) {
      MultiTokenPrediction::Depth& d = *m.mtp->layers[static_cast<size_t>(k)];
      const std::string first = "mtp.layers." + std::to_string(k * L) + ".";
      add(first + "enorm.weight", d.enorm.weight, {h});
      add(first + "hnorm.weight", d.hnorm.weight, {h});
      add(first + "eh_proj.weight", d.eh_proj.weight(), {h, 2 * h});
      for (int64_t j = 0; j < L; ++j)
        layer_maps(*d.layers[static_cast<size_t>(j)], mb.mtp_layers[static_cast<size_t>(j)],
                   "mtp.layers." + std::to_string(k * L + j) + ".");
      add("mtp.layers." + std::to_string(k * L + L - 1) + ".final_layernorm.weight",
          d.final_layernorm.weight, {h});
    }
  }
  if (c.untie_embeddings_and_output_weights) add("lm_head.weight", m.head->own_weight, {V, h});
  return maps;
}

// NemotronH's config names some Mamba keys two ways (its constructor's mamba_* arguments and the
// attributes it stores); either is read.
template <typename T>
T either(const nlohmann::json& j, const std::string& a, const std::string& b, T fallback,
         const std::string& file) {
  if (j.contains(a) && !j[a].is_null()) return hf_get<T>(j, a, file);
  return hf_get_or<T>(j, b, fallback, file);
}

// The layer symbols: layers_block_type (NemotronHConfig's field since transformers 5; "layer_types"
// its alias) names each layer ("linear_attention" or legacy "mamba", "full_attention" or legacy
// "attention", "mlp", "moe") and wins over the legacy hybrid_override_pattern string, as in
// NemotronHConfig.
std::string read_layer_pattern(const nlohmann::json& j, const std::string& file,
                               const std::vector<std::string>& list_keys = {"layers_block_type",
                                                                            "layer_types"},
                               const std::string& string_key = "hybrid_override_pattern") {
  for (const std::string& key : list_keys) {
    if (!j.contains(key) || j[key].is_null()) continue;
    MEGATRON_CHECK(j[key].is_array(), file, ": ", key, " must be a list of layer types");
    std::string pattern;
    for (const auto& t : j[key]) {
      const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
      if (type == "linear_attention" || type == "mamba") {
        pattern += 'M';
      } else if (type == "full_attention" || type == "attention") {
        pattern += '*';
      } else if (type == "mlp") {
        pattern += '-';
      } else if (type == "moe") {
        pattern += 'E';
      } else {
        MEGATRON_CHECK(false, file, ": ", key, ": layer type '", type,
                       "' is not supported (linear_attention, full_attention, mlp, moe)");
      }
    }
    MEGATRON_CHECK(!pattern.empty(), file, ": ", key, " is empty");
    return pattern;
  }
  const std::string pattern = hf_get<std::string>(j, string_key, file);
  for (char ch : pattern)
    MEGATRON_CHECK(ch == 'M' || ch == '*' || ch == '-' || ch == 'E', file, ": ", string_key, " '",
                   pattern, "': layer type '", std::string(1, ch),
                   "' is not supported (M, *, - and E)");
  MEGATRON_CHECK(!pattern.empty(), file, ": ", string_key, " is empty");
  return pattern;
}

// Whether the directory's weights hold multi-token prediction tensors (none when it has no
// weights yet: a config alone is taken at its word).
bool has_mtp_tensors(const std::string& dir) {
  namespace fs = std::filesystem;
  using safetensors::SafetensorsDir;
  if (!fs::exists(fs::path(dir) / SafetensorsDir::kSingleFile) &&
      !fs::exists(fs::path(dir) / SafetensorsDir::kIndexFile))
    return true;
  for (const std::string& n : safetensors::SafetensorsDir::open(dir).names())
    if (n.rfind("mtp.", 0) == 0) return true;
  return false;
}

nlohmann::json config_json(const TransformerConfig& c, DType dtype) {
  const MambaConfig& mb = c.mamba;
  nlohmann::json j = {{"model_type", "nemotron_h"},
                      {"architectures", {"NemotronHForCausalLM"}},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.ffn_hidden_size},
                      {"num_hidden_layers", c.num_layers},
                      {"hybrid_override_pattern", mb.layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_query_groups},
                      {"head_dim", c.kv_channels},
                      {"attention_head_dim", c.kv_channels},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"mlp_hidden_act", "relu2"},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"use_bias", false},
                      {"use_conv_bias", true},
                      {"layer_norm_epsilon", c.norm_epsilon},
                      {"residual_in_fp32", false},
                      {"ssm_state_size", mb.state_dim},
                      {"mamba_num_heads", mb.heads(c.hidden_size)},
                      {"mamba_head_dim", mb.head_dim},
                      {"n_groups", mb.num_groups},
                      {"conv_kernel", mb.d_conv},
                      {"expand", mb.expand},
                      {"mamba_hidden_act", "silu"},
                      {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
                      {"torch_dtype", torch_dtype_name(dtype)}};
  if (c.mtp_num_layers > 0) {  // Megatron-Bridge's keys: the blocks the files hold
    j["num_nextn_predict_layers"] = c.mtp_blocks();
    j["mtp_hybrid_override_pattern"] = mb.mtp_layers;
    j["mtp_use_repeated_layer"] = c.mtp_use_repeated_layer;
  }
  if (c.moe.enabled()) {
    write_noaux_tc_router(c.moe, j);
    j["moe_intermediate_size"] = c.moe.ffn_hidden_size;
    j["moe_shared_expert_intermediate_size"] = c.moe.shared_expert_intermediate_size;
    j["moe_latent_size"] =
        c.moe.latent_size > 0 ? nlohmann::json(c.moe.latent_size) : nlohmann::json(nullptr);
  }
  return j;
}

}  // namespace

NemotronHInfo read_nemotron_h_config(const std::string& dir) {
  const std::string file = dir + "/config.json";
  NemotronHInfo info;
  info.raw = read_hf_config_json(dir);
  const nlohmann::json& j = info.raw;
  const std::string type = hf_get_or<std::string>(j, "model_type", "", file);
  MEGATRON_CHECK(type == "nemotron_h", file, ": model_type '", type,
                 "' is not a hybrid Mamba model; --model mamba loads nemotron_h (NemotronH) "
                 "directories");
  TransformerConfig& c = info.config;
  c.hidden_size = hf_get<int64_t>(j, "hidden_size", file);
  c.ffn_hidden_size = hf_get<int64_t>(j, "intermediate_size", file);
  c.num_attention_heads = hf_get<int64_t>(j, "num_attention_heads", file);
  c.num_query_groups = hf_get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, file);
  // NemotronHConfig's head_dim (default 128); its remote-code config's attention_head_dim.
  c.kv_channels = either<int64_t>(j, "head_dim", "attention_head_dim", 128, file);
  c.vocab_size = hf_get<int64_t>(j, "vocab_size", file);
  c.max_position_embeddings = hf_get_or<int64_t>(j, "max_position_embeddings", 4096, file);
  c.seq_length = c.max_position_embeddings;
  c.position_embedding = PositionEmbedding::kNone;
  c.normalization = Normalization::kRMSNorm;
  c.norm_epsilon = hf_get_or<double>(j, "layer_norm_epsilon", 1e-5, file);
  MEGATRON_CHECK(std::abs(c.norm_epsilon - 1e-5) < 1e-12, file, ": layer_norm_epsilon ",
                 c.norm_epsilon,
                 " is not supported: Megatron's Mamba mixer normalises with 1e-5 (the other norms "
                 "take --norm-epsilon)");
  const std::string act = hf_get_or<std::string>(j, "mlp_hidden_act", "relu2", file);
  MEGATRON_CHECK(act == "relu2", file, ": mlp_hidden_act '", act,
                 "' is not supported; NemotronH's MLP layers are relu2 (--squared-relu)");
  c.squared_relu = true;
  for (const char* key : {"attention_bias", "mlp_bias", "use_bias"})
    MEGATRON_CHECK(!hf_get_or<bool>(j, key, false, file), file, ": ", key,
                   " is not supported (Megatron's hybrid layers have no biases here)");
  MEGATRON_CHECK(either<bool>(j, "use_conv_bias", "mamba_conv_bias", true, file), file,
                 ": use_conv_bias false is not supported (Megatron's mixer has a conv1d bias)");
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = !hf_get_or<bool>(j, "tie_word_embeddings", false, file);
  MambaConfig& mb = c.mamba;
  mb.layers = read_layer_pattern(j, file);
  // The layer count is the pattern's (as NemotronHConfig derives num_hidden_layers from it).
  c.num_layers = static_cast<int64_t>(mb.layers.size());
  // Multi-token prediction (Nemotron 3 Super's mtp.*): num_nextn_predict_layers blocks of
  // mtp_hybrid_override_pattern's layers (transformers 5: mtp_layers_block_type), each a depth.
  // With mtp_use_repeated_layer (Megatron-Bridge's default when absent; here only when true)
  // one block is applied at every depth: --mtp-num-layers then asks for more depths than the
  // files' one block (merge_pretrained_config); absent, each block is a depth.
  c.mtp_num_layers = hf_get_or<int64_t>(j, "num_nextn_predict_layers", 0, file);
  c.mtp_use_repeated_layer =
      c.mtp_num_layers == 1 && hf_get_or<bool>(j, "mtp_use_repeated_layer", false, file);
  if (c.mtp_num_layers > 0 && !has_mtp_tensors(dir)) {
    // A directory saved by Hugging Face's model, which drops mtp.*, keeps the config's count.
    log_line("warning: " + file + " describes " + std::to_string(c.mtp_num_layers) +
             " multi-token prediction blocks, but the weights hold no mtp.* tensor: loaded "
             "without multi-token prediction");
    c.mtp_num_layers = 0;
    c.mtp_use_repeated_layer = false;
  }
  MEGATRON_CHECK(c.mtp_num_layers >= 0, file, ": num_nextn_predict_layers must be >= 0");
  if (c.mtp_num_layers > 0)
    mb.mtp_layers =
        read_layer_pattern(j, file, {"mtp_layers_block_type"}, "mtp_hybrid_override_pattern");
  const std::string all_layers = [&] {
    std::string l = mb.layers;
    for (int64_t k = 0; k < c.mtp_blocks(); ++k) l += mb.mtp_layers;
    return l;
  }();
  if (all_layers.find('E') != std::string::npos) {
    // NemotronHMoE (Nemotron 3's MoE layers): DeepSeek-V3's router over n_routed_experts
    // squared-ReLU experts of moe_intermediate_size, plus one shared MLP of
    // moe_shared_expert_intermediate_size (NemotronHConfig's defaults for missing keys).
    MoeConfig& m = c.moe;
    m.num_experts = either<int64_t>(j, "n_routed_experts", "num_local_experts", 8, file);
    m.router_topk = hf_get_or<int64_t>(j, "num_experts_per_tok", 2, file);
    m.ffn_hidden_size = hf_get_or<int64_t>(j, "moe_intermediate_size", 7688, file);
    m.shared_expert_intermediate_size =
        hf_get_or<int64_t>(j, "moe_shared_expert_intermediate_size", 7688, file);
    // Nemotron 3's LatentMoE (null or absent: the experts at the hidden size).
    if (j.contains("moe_latent_size") && !j["moe_latent_size"].is_null())
      m.latent_size = hf_get_or<int64_t>(j, "moe_latent_size", 0, file);
    read_noaux_tc_router(j, file, m);
    for (char t : all_layers) m.layer_pattern.push_back(t == 'E' ? 1 : 0);
  }
  mb.state_dim = hf_get_or<int64_t>(j, "ssm_state_size", 128, file);
  mb.num_heads = hf_get_or<int64_t>(j, "mamba_num_heads", 128, file);
  mb.head_dim = hf_get_or<int64_t>(j, "mamba_head_dim", 64, file);
  mb.num_groups = either<int64_t>(j, "n_groups", "mamba_n_groups", 8, file);
  const std::string mamba_act = hf_get_or<std::string>(j, "mamba_hidden_act", "silu", file);
  MEGATRON_CHECK(mamba_act == "silu", file, ": mamba_hidden_act '", mamba_act,
                 "' is not supported (Megatron's mixer applies SiLU after its convolution)");
  const int64_t d_conv = either<int64_t>(j, "conv_kernel", "mamba_d_conv", 4, file);
  MEGATRON_CHECK(d_conv == 4, file, ": conv_kernel ", d_conv,
                 " is not supported (Megatron's mixer convolves over 4 positions)");
  if (j.contains("time_step_limit") && j["time_step_limit"].is_array()) {
    const auto& lim = j["time_step_limit"];
    const bool open =
        lim.size() == 2 && lim[0].is_number() && lim[0].get<double>() == 0.0 &&
        (lim[1].is_string() || (lim[1].is_number() && std::isinf(lim[1].get<double>())));
    MEGATRON_CHECK(open, file, ": time_step_limit ", lim.dump(),
                   " is not supported (Megatron's mixer does not clamp dt: [0, inf])");
  }
  const std::string dtype_key = j.contains("torch_dtype") ? "torch_dtype" : "dtype";
  info.dtype = hf_dtype_from_torch(hf_get_or<std::string>(j, dtype_key, "float32", file), file);
  return info;
}

void check_nemotron_h_exportable(const TransformerConfig& c) {
  MEGATRON_CHECK(c.mamba.enabled(), "NemotronH export needs a hybrid Mamba model (--model mamba)");
  if (c.moe.enabled()) {
    check_noaux_tc_router_exportable(c.moe, "NemotronH");
    MEGATRON_CHECK(c.moe.shared_expert_intermediate_size > 0 && !c.moe.shared_expert_gate,
                   "this hybrid model has no NemotronH equivalent: NemotronH's MoE layers always "
                   "have a shared MLP (--moe-shared-expert-intermediate-size), without a gate "
                   "(--moe-shared-expert-gate)");
  }
  MEGATRON_CHECK(c.normalization == Normalization::kRMSNorm && !c.layernorm_zero_centered_gamma &&
                     std::abs(c.norm_epsilon - 1e-5) < 1e-12,
                 "this hybrid model has no NemotronH equivalent: NemotronH's norms are RMSNorm "
                 "with epsilon 1e-5 (--normalization RMSNorm, no --apply-layernorm-1p)");
  MEGATRON_CHECK(c.squared_relu && !c.gated_mlp(),
                 "this hybrid model has no NemotronH equivalent: its MLP layers are squared ReLU "
                 "(--squared-relu)");
  MEGATRON_CHECK(!c.add_bias_linear && !c.add_qkv_bias,
                 "this hybrid model has no NemotronH equivalent: no biases "
                 "(--disable-bias-linear)");
  MEGATRON_CHECK(c.position_embedding == PositionEmbedding::kNone,
                 "this hybrid model has no NemotronH equivalent: its attention has no positional "
                 "embedding (--position-embedding-type none)");
  MEGATRON_CHECK(!c.qk_layernorm && !c.qk_l2_norm && c.softmax_scale == 0 &&
                     !c.attention_output_gate && c.mamba.d_conv == 4,
                 "this hybrid model has no NemotronH equivalent: plain attention (no "
                 "--qk-layernorm, --qk-l2-norm, --softmax-scale or --attention-output-gate)");
}

void load_nemotron_h_weights(const std::string& dir, GPTModel& model, ParamSet& params) {
  auto st = safetensors::SafetensorsDir::open(dir);
  std::map<std::string, std::string> by_name;
  for (const std::string& n : st.names()) by_name[n] = n;
  std::map<Param*, Tensor> staged;
  for (Param* p : params.params()) staged[p] = Tensor::zeros(p->shape, DType::kF64);
  const std::set<std::string> used = read_mapped_tensors(st, by_name, mappings(model), staged, dir);
  const bool tied = !model.config().untie_embeddings_and_output_weights;
  // Under expert parallelism the other ranks' experts (the same range in every MoE layer).
  int64_t first_local = 0, num_local = 0;
  std::vector<const TransformerLayer*> layers;
  for (const auto& layer : model.decoder->layers) layers.push_back(layer.get());
  if (model.mtp)
    for (const auto& d : model.mtp->layers)
      for (const auto& layer : d->layers) layers.push_back(layer.get());
  for (const TransformerLayer* layer : layers)
    if (layer->moe) {
      first_local = layer->moe->experts.first_expert();
      num_local = layer->moe->experts.num_local();
    }
  // Without MTP depths in config.json, its prediction layers' tensors (mtp.*) are skipped, as
  // Hugging Face's model does; export copies them back from the source.
  const bool skip_mtp = !model.mtp;
  for (const auto& [name, full] : by_name)
    MEGATRON_CHECK(
        used.count(name) || (tied && name == "lm_head.weight") ||
            (skip_mtp && name.rfind("mtp.", 0) == 0) ||
            is_peer_expert_tensor(name, model.config().moe.num_experts, first_local, num_local),
        dir, ": unexpected tensor '", full, "' for a NemotronH model as config.json describes it");
  for (auto& [p, t] : staged) params.set_main(*p, t);
  params.sync_compute_from_main();
}

std::map<std::string, Tensor> nemotron_h_tensors(const GPTModel& model, bool grads) {
  GPTModel& m = const_cast<GPTModel&>(model);  // mappings take non-const Params; nothing written
  return mapped_hf_tensors(mappings(m), grads);
}

void save_nemotron_h(const std::string& dir, const GPTModel& model, const std::string& source_dir,
                     std::optional<DType> dtype) {
  check_nemotron_h_exportable(model.config());
  nlohmann::json config;
  DType out = DType::kF32;
  if (!source_dir.empty()) {
    const NemotronHInfo src = read_nemotron_h_config(source_dir);
    config = src.raw;
    out = src.dtype;
  }
  if (dtype) out = *dtype;
  if (source_dir.empty()) config = config_json(model.config(), out);
  const TransformerConfig& c = model.config();
  if (c.mtp_num_layers > 0) {  // the blocks written, whatever the source said
    config["num_nextn_predict_layers"] = c.mtp_blocks();
    config["mtp_use_repeated_layer"] = c.mtp_use_repeated_layer;
    if (!config.contains("mtp_layers_block_type"))
      config["mtp_hybrid_override_pattern"] = c.mamba.mtp_layers;
  }
  config["torch_dtype"] = torch_dtype_name(out);
  // An open time_step_limit [0, inf] (read from Python's bare Infinity as a string) is
  // NemotronHConfig's default: left out rather than written back as a string.
  config.erase("time_step_limit");
  std::map<std::string, Tensor> tensors = nemotron_h_tensors(model, false);
  if (!source_dir.empty() && !model.mtp) {  // prediction layers the model does not hold
    auto st = safetensors::SafetensorsDir::open(source_dir);
    for (const std::string& n : st.names())
      if (n.rfind("mtp.", 0) == 0) tensors[n] = st.read(n).to(DType::kF64);
  }
  write_hf_dir(dir, tensors, out, config);
}

}  // namespace megatron
