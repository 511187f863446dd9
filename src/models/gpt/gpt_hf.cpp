// config.json parsing for GPT-2 and Llama families, and the name/layout mapping between HF tensors
// and our parameters (transposes, per-group QKV rows, [gate; up], vocabulary padding).
#include "models/gpt/gpt_hf.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "checkpoint/safetensors_dir.h"
#include "models/common/hf_tensors.h"
#include "models/gpt/deepseek_hf.h"
#include "models/gpt/gpt_oss_hf.h"
#include "models/gpt/nemotron_nas_hf.h"

namespace megatron {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

template <typename T>
T get(const json& j, const std::string& key, const std::string& file) {
  return hf_get<T>(j, key, file);
}

template <typename T>
T get_or(const json& j, const std::string& key, T fallback, const std::string& file) {
  return hf_get_or<T>(j, key, fallback, file);
}

DType dtype_from_torch(const std::string& s, const std::string& file) {
  return hf_dtype_from_torch(s, file);
}

}  // namespace

namespace {

// Mixtral's, Qwen2-MoE's and Qwen3-MoE's experts as Megatron's MoE flags. Mixtral's router is
// softmax over all experts, top-k, renormalised over the k: Megatron's default post-softmax over
// the k selected logits (the same numbers). Qwen2/3-MoE renormalise only with norm_topk_prob;
// without it the probabilities are the pre-top-k softmax (--moe-router-pre-softmax). Qwen2-MoE
// adds a shared expert whose output a sigmoid gate scales per token (--moe-shared-expert-
// intermediate-size with --moe-shared-expert-gate). HF's auxiliary loss is not carried over (its
// coefficient, if any, is a training choice: --moe-aux-loss-coeff).
void read_hf_moe(const json& j, const std::string& model_type, const std::string& file,
                 TransformerConfig& c) {
  if (model_type == "mixtral") {
    c.moe.num_experts = get<int64_t>(j, "num_local_experts", file);
    c.moe.router_topk = get_or<int64_t>(j, "num_experts_per_tok", 2, file);
    c.moe.ffn_hidden_size = get<int64_t>(j, "intermediate_size", file);
  } else if (model_type == "qwen3_moe" || model_type == "qwen2_moe") {
    if (model_type == "qwen2_moe") {
      c.moe.shared_expert_intermediate_size =
          get<int64_t>(j, "shared_expert_intermediate_size", file);
      MEGATRON_CHECK(c.moe.shared_expert_intermediate_size > 0, file,
                     ": shared_expert_intermediate_size must be > 0 (Qwen2-MoE's shared expert)");
      c.moe.shared_expert_gate = true;
    }
    c.moe.num_experts = get<int64_t>(j, "num_experts", file);
    c.moe.router_topk = get_or<int64_t>(j, "num_experts_per_tok", 8, file);
    c.moe.ffn_hidden_size = get<int64_t>(j, "moe_intermediate_size", file);
    c.moe.pre_softmax = !get_or<bool>(j, "norm_topk_prob", false, file);
    const int64_t step = get_or<int64_t>(j, "decoder_sparse_step", 1, file);
    MEGATRON_CHECK(step >= 1, file, ": decoder_sparse_step must be >= 1");
    std::vector<int64_t> dense;
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null())
      dense = j["mlp_only_layers"].get<std::vector<int64_t>>();
    const int64_t L = get<int64_t>(j, "num_hidden_layers", file);
    // HF: layer i is sparse iff it is not in mlp_only_layers and (i + 1) % step == 0.
    for (int64_t i = 0; i < L; ++i) {
      const bool is_dense = std::find(dense.begin(), dense.end(), i) != dense.end();
      c.moe.layer_pattern.push_back(!is_dense && (i + 1) % step == 0 ? 1 : 0);
    }
    bool all = true;
    for (int x : c.moe.layer_pattern) all = all && x == 1;
    if (all) c.moe.layer_pattern.clear();
  } else {
    return;
  }
  c.moe.aux_loss_coeff = {0.0};
}

}  // namespace

HfModelInfo read_hf_config(const std::string& dir) {
  return hf_info_from_json(read_hf_config_json(dir), (fs::path(dir) / "config.json").string());
}

HfModelInfo hf_info_from_json(const nlohmann::json& config, const std::string& file) {
  HfModelInfo info;
  info.raw = config;
  const json& j = info.raw;
  const std::string model_type = get<std::string>(j, "model_type", file);
  info.model_type = model_type;
  TransformerConfig& c = info.config;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  if (model_type == "gpt2") {
    info.arch = HfArch::kGpt2;
    c.num_layers = get<int64_t>(j, "n_layer", file);
    c.hidden_size = get<int64_t>(j, "n_embd", file);
    c.num_attention_heads = get<int64_t>(j, "n_head", file);
    c.ffn_hidden_size = get_or<int64_t>(j, "n_inner", 4 * c.hidden_size, file);
    c.max_position_embeddings = get<int64_t>(j, "n_positions", file);
    c.vocab_size = get<int64_t>(j, "vocab_size", file);
    c.norm_epsilon = get_or<double>(j, "layer_norm_epsilon", 1e-5, file);
    const std::string act = get_or<std::string>(j, "activation_function", "gelu_new", file);
    MEGATRON_CHECK(
        act == "gelu_new" || act == "gelu" || act == "gelu_pytorch_tanh" || act == "relu2", file,
        ": activation_function '", act,
        "' is not supported (gelu_new, gelu_pytorch_tanh, gelu, relu2)");
    c.squared_relu = act == "relu2";  // HF's ReLUSquaredActivation: --squared-relu
    c.openai_gelu = act != "gelu" && !c.squared_relu;
    c.normalization = Normalization::kLayerNorm;
    c.position_embedding = PositionEmbedding::kLearnedAbsolute;
    c.add_bias_linear = true;
    MEGATRON_CHECK(get_or<bool>(j, "tie_word_embeddings", true, file), file,
                   ": untied GPT-2 output weights are not supported");
    c.untie_embeddings_and_output_weights = false;
    MEGATRON_CHECK(!get_or<bool>(j, "scale_attn_by_inverse_layer_idx", false, file) &&
                       !get_or<bool>(j, "reorder_and_upcast_attn", false, file),
                   file,
                   ": scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported");
  } else if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2" ||
             model_type == "qwen3" || model_type == "mixtral" || model_type == "qwen3_moe" ||
             model_type == "qwen2_moe" || model_type == "nemotron-nas") {
    // nemotron-nas (Llama-Nemotron): Llama with a block list of differing layers; its query
    // groups and MLP widths are the blocks'.
    const bool nas = model_type == "nemotron-nas";
    info.arch = HfArch::kLlama;
    // Qwen3 is Llama with an RMSNorm over each query and key head (q_norm, k_norm):
    // Megatron's --qk-layernorm.
    c.qk_layernorm = model_type == "qwen3" || model_type == "qwen3_moe";
    read_hf_moe(j, model_type, file, c);
    c.num_layers = get<int64_t>(j, "num_hidden_layers", file);
    c.hidden_size = get<int64_t>(j, "hidden_size", file);
    c.num_attention_heads = get<int64_t>(j, "num_attention_heads", file);
    c.num_query_groups = get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, file);
    c.kv_channels = get_or<int64_t>(j, "head_dim", 0, file);
    c.ffn_hidden_size = get_or<int64_t>(j, "intermediate_size", 0, file);
    MEGATRON_CHECK(c.ffn_hidden_size > 0 || c.moe.enabled() || nas, file,
                   ": intermediate_size is missing");
    if (c.ffn_hidden_size == 0) c.ffn_hidden_size = c.moe.ffn_hidden_size;
    c.max_position_embeddings = get<int64_t>(j, "max_position_embeddings", file);
    c.vocab_size = get<int64_t>(j, "vocab_size", file);
    c.norm_epsilon = get_or<double>(j, "rms_norm_eps", 1e-6, file);
    c.rotary_base = get_or<double>(j, "rope_theta", 10000.0, file);
    const std::string act = get_or<std::string>(j, "hidden_act", "silu", file);
    MEGATRON_CHECK(act == "silu", file, ": hidden_act '", act, "' is not supported (silu)");
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      // Llama 3.1's "llama3" scaling (Megatron's --use-rope-scaling, whose other constants it
      // fixes) and "linear" position interpolation (--rotary-seq-len-interpolation-factor).
      const json& rs = j["rope_scaling"];
      const std::string type =
          get_or<std::string>(rs, "rope_type", get_or<std::string>(rs, "type", "", file), file);
      const double factor = get<double>(rs, "factor", file);
      if (type == "llama3") {
        MEGATRON_CHECK(
            get_or<double>(rs, "low_freq_factor", 1.0, file) == 1.0 &&
                get_or<double>(rs, "high_freq_factor", 4.0, file) == 4.0 &&
                get_or<int64_t>(rs, "original_max_position_embeddings", 8192, file) == 8192,
            file,
            ": rope_scaling llama3 loads with Megatron's constants only "
            "(low_freq_factor 1, high_freq_factor 4, "
            "original_max_position_embeddings 8192)");
        c.rope_scaling_factor = factor;
      } else if (type == "linear") {
        c.rotary_seq_len_interpolation_factor = factor;
      } else {
        MEGATRON_CHECK(false, file, ": rope_scaling type '", type,
                       "' is not supported (llama3 or linear)");
      }
    }
    MEGATRON_CHECK(!j.contains("sliding_window") || j["sliding_window"].is_null() ||
                       !get_or<bool>(j, "use_sliding_window", model_type == "mistral", file),
                   file,
                   ": sliding-window attention is not supported; only full causal "
                   "attention models load");
    c.normalization = Normalization::kRMSNorm;
    c.swiglu = true;
    c.position_embedding = PositionEmbedding::kRope;
    // Qwen2-MoE's q/k/v biases are its qkv_bias (always on before transformers had the key).
    const bool qwen2 = model_type == "qwen2" || model_type == "qwen2_moe";
    const bool attn_bias = model_type == "qwen2_moe"
                               ? get_or<bool>(j, "qkv_bias", true, file)
                               : get_or<bool>(j, "attention_bias", model_type == "qwen2", file);
    MEGATRON_CHECK(!get_or<bool>(j, "mlp_bias", false, file), file, ": mlp_bias is not supported");
    // Qwen2 has biases on q, k, v only (Megatron's --add-qkv-bias); Llama's attention_bias also
    // covers o_proj, which Megatron cannot express separately from the MLP.
    MEGATRON_CHECK(!attn_bias || qwen2, file,
                   ": attention_bias with a bias on o_proj is not supported");
    c.add_bias_linear = false;
    c.add_qkv_bias = attn_bias;
    c.untie_embeddings_and_output_weights = !get_or<bool>(j, "tie_word_embeddings", false, file);
    if (nas) read_nemotron_nas_config(j, file, c);
  } else if (model_type == "deepseek_v3") {
    info.arch = HfArch::kLlama;  // Llama's embedding, norms, dense MLPs and head
    read_deepseek_v3_config(j, file, c);
  } else if (model_type == "gpt_oss") {
    info.arch = HfArch::kLlama;  // Llama's embedding, final norm and head
    read_gpt_oss_config(j, file, c);
  } else {
    MEGATRON_CHECK(false, file, ": model_type '", model_type,
                   "' is not supported; supported: gpt2, llama (also mistral, qwen2, qwen3, "
                   "mixtral, qwen2_moe, qwen3_moe, nemotron-nas layouts), deepseek_v3, gpt_oss");
  }
  // Newer transformers write "dtype"; older ones "torch_dtype".
  const std::string dtype_key = j.contains("torch_dtype") ? "torch_dtype" : "dtype";
  info.dtype = dtype_from_torch(get_or<std::string>(j, dtype_key, "float32", file), file);
  c.seq_length = c.max_position_embeddings;
  return info;
}

using Mapping = HfTensorMapping;

std::vector<Mapping> hf_tensor_mappings(const HfModelInfo& info, GPTModel& m) {
  const TransformerConfig& c = m.config();
  const int64_t h = c.hidden_size, hn = c.head_dim();
  const int64_t np = c.num_attention_heads;
  const int64_t ffn = c.ffn_hidden_size, V = c.vocab_size;
  std::vector<Mapping> maps;
  auto add = [&](const std::string& name, Param& p, Shape shape, bool transpose = false,
                 std::vector<int64_t> rows = {}, int64_t row_begin = 0) {
    maps.push_back(Mapping{name, &p, row_begin, std::move(rows), transpose, shape, 0.0});
  };
  auto all_rows = [&](int part) { return packed_qkv_rows(c, part); };

  if (info.arch == HfArch::kGpt2) {
    add("wte.weight", m.embedding->word_embeddings, {V, h});
    add("wpe.weight", m.embedding->position_embeddings, {c.max_position_embeddings, h});
    for (int64_t i = 0; i < c.num_layers; ++i) {
      auto& L = *m.decoder->layers[i];
      const std::string p = "h." + std::to_string(i) + ".";
      add(p + "ln_1.weight", L.input_layernorm->weight, {h});
      add(p + "ln_1.bias", L.input_layernorm->bias, {h});
      // c_attn columns are [Q | K | V]; ours are grouped per head.
      std::vector<int64_t> qkv;
      for (int64_t part = 0; part < 3; ++part) {
        auto r = all_rows(part);
        qkv.insert(qkv.end(), r.begin(), r.end());
      }
      add(p + "attn.c_attn.weight", L.self_attention->linear_qkv->weight(), {h, 3 * h}, true, qkv);
      add(p + "attn.c_attn.bias", L.self_attention->linear_qkv->bias(), {3 * h}, false, qkv);
      add(p + "attn.c_proj.weight", L.self_attention->linear_proj.weight(), {h, h}, true);
      add(p + "attn.c_proj.bias", L.self_attention->linear_proj.bias, {h});
      add(p + "ln_2.weight", L.pre_mlp_layernorm->weight, {h});
      add(p + "ln_2.bias", L.pre_mlp_layernorm->bias, {h});
      add(p + "mlp.c_fc.weight", L.mlp->linear_fc1.weight(), {h, ffn}, true);
      add(p + "mlp.c_fc.bias", L.mlp->linear_fc1.bias(), {ffn});
      add(p + "mlp.c_proj.weight", L.mlp->linear_fc2.weight(), {ffn, h}, true);
      add(p + "mlp.c_proj.bias", L.mlp->linear_fc2.bias, {h});
    }
    add("ln_f.weight", m.decoder->final_layernorm.weight, {h});
    add("ln_f.bias", m.decoder->final_layernorm.bias, {h});
  } else {
    add("model.embed_tokens.weight", m.embedding->word_embeddings, {V, h});
    // Decoder layer i, or (i >= num_layers) multi-token prediction depth i - num_layers's
    // transformer layer, where DeepSeek-V3 keeps it (its extra tensors below).
    const auto layer_maps = [&](TransformerLayer& L, int64_t i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      if (info.model_type == "gpt_oss") {
        add_gpt_oss_layer_mappings(c, L, p, maps);
        return;
      }
      // A heterogeneous layer's own sizes; its no-op branches have no tensors, its linear
      // replacements one [h, h] weight (nemotron-nas).
      const TransformerConfig& lc = L.config();
      const int64_t ngl = lc.num_query_groups, ffnl = lc.ffn_hidden_size;
      auto layer_rows = [&](int part) { return packed_qkv_rows(lc, part); };
      if (L.has_attention()) add(p + "input_layernorm.weight", L.input_layernorm->weight, {h});
      if (L.linear_attention) {
        add(p + "self_attn.linear_attn.weight", L.linear_attention->linear.weight(), {h, h});
      } else if (L.self_attention && c.mla.enabled) {
        add_deepseek_attention_mappings(c, L, p, maps);
      } else if (L.self_attention) {
        add(p + "self_attn.q_proj.weight", L.self_attention->linear_qkv->weight(), {np * hn, h},
            false, layer_rows(0));
        add(p + "self_attn.k_proj.weight", L.self_attention->linear_qkv->weight(), {ngl * hn, h},
            false, layer_rows(1));
        add(p + "self_attn.v_proj.weight", L.self_attention->linear_qkv->weight(), {ngl * hn, h},
            false, layer_rows(2));
        if (c.add_qkv_bias) {
          add(p + "self_attn.q_proj.bias", L.self_attention->linear_qkv->bias(), {np * hn}, false,
              layer_rows(0));
          add(p + "self_attn.k_proj.bias", L.self_attention->linear_qkv->bias(), {ngl * hn}, false,
              layer_rows(1));
          add(p + "self_attn.v_proj.bias", L.self_attention->linear_qkv->bias(), {ngl * hn}, false,
              layer_rows(2));
        }
        add(p + "self_attn.o_proj.weight", L.self_attention->linear_proj.weight(), {h, np * hn});
        if (c.qk_layernorm) {
          add(p + "self_attn.q_norm.weight", L.self_attention->q_layernorm->weight, {hn});
          add(p + "self_attn.k_norm.weight", L.self_attention->k_layernorm->weight, {hn});
        }
      }
      if (L.has_mlp()) add(p + "post_attention_layernorm.weight", L.pre_mlp_layernorm->weight, {h});
      if (L.linear_mlp) {
        add(p + "mlp.linear_mlp.weight", L.linear_mlp->linear.weight(), {h, h});
      } else if (L.moe && info.model_type == "deepseek_v3") {
        add_deepseek_moe_mappings(c, L, p, maps);
      } else if (L.moe) {
        // Mixtral: block_sparse_moe.gate, experts.E.w1 (gate) / w3 (up) / w2 (down);
        // Qwen3-MoE: mlp.gate, mlp.experts.E.gate_proj / up_proj / down_proj.
        const bool mixtral = info.model_type == "mixtral";
        const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
        const int64_t fe = c.moe.ffn_hidden_size;
        add(moe + "gate.weight", L.moe->router.weight, {c.moe.num_experts, h});
        for (int64_t e = 0; e < L.moe->experts.num_local(); ++e) {
          const std::string x =
              moe + "experts." + std::to_string(L.moe->experts.first_expert() + e) + ".";
          add(x + (mixtral ? "w1" : "gate_proj") + ".weight", L.moe->experts.fc1(e), {fe, h}, false,
              {}, 0);
          add(x + (mixtral ? "w3" : "up_proj") + ".weight", L.moe->experts.fc1(e), {fe, h}, false,
              {}, fe);
          add(x + (mixtral ? "w2" : "down_proj") + ".weight", L.moe->experts.fc2(e), {h, fe});
        }
        if (L.moe->shared_experts) {  // Qwen2-MoE: mlp.shared_expert and its gate
          const int64_t fs = c.moe.shared_expert_intermediate_size;
          add(moe + "shared_expert.gate_proj.weight", L.moe->shared_experts->linear_fc1.weight(),
              {fs, h}, false, {}, 0);
          add(moe + "shared_expert.up_proj.weight", L.moe->shared_experts->linear_fc1.weight(),
              {fs, h}, false, {}, fs);
          add(moe + "shared_expert.down_proj.weight", L.moe->shared_experts->linear_fc2.weight(),
              {h, fs});
          add(moe + "shared_expert_gate.weight", L.moe->shared_expert_gate->weight, {1, h});
        }
      } else if (L.mlp) {
        add(p + "mlp.gate_proj.weight", L.mlp->linear_fc1.weight(), {ffnl, h}, false, {}, 0);
        add(p + "mlp.up_proj.weight", L.mlp->linear_fc1.weight(), {ffnl, h}, false, {}, ffnl);
        add(p + "mlp.down_proj.weight", L.mlp->linear_fc2.weight(), {h, ffnl});
      }
    };
    for (int64_t i = 0; i < c.num_layers; ++i) layer_maps(*m.decoder->layers[i], i);
    if (m.mtp) {
      for (int64_t k = 0; k < static_cast<int64_t>(m.mtp->layers.size()); ++k) {
        MultiTokenPrediction::Depth& d = *m.mtp->layers[k];
        const std::string p = "model.layers." + std::to_string(c.num_layers + k) + ".";
        layer_maps(*d.layers.front(), c.num_layers + k);
        add(p + "enorm.weight", d.enorm.weight, {h});
        add(p + "hnorm.weight", d.hnorm.weight, {h});
        add(p + "eh_proj.weight", d.eh_proj.weight(), {h, 2 * h});
        add(p + "shared_head.norm.weight", d.final_layernorm.weight, {h});
      }
    }
    add("model.norm.weight", m.decoder->final_layernorm.weight, {h});
    if (c.untie_embeddings_and_output_weights) add("lm_head.weight", m.head->own_weight, {V, h});
  }
  // --apply-layernorm-1p stores a norm's scale as weight = gamma - 1; Hugging Face stores gamma.
  if (c.layernorm_zero_centered_gamma) {
    for (Mapping& mp : maps) {
      const std::string& n = mp.param->name;
      if (n.size() > 16 && n.compare(n.size() - 16, 16, "layernorm.weight") == 0) mp.offset = 1;
    }
  }
  return maps;
}

namespace {

// The same dtype, shape and bytes.
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<Mapping> build_mappings(const HfModelInfo& info, GPTModel& m) {
  return hf_tensor_mappings(info, m);
}

std::string strip_prefix(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

}  // namespace

void load_hf_weights(const std::string& dir, const HfModelInfo& info, GPTModel& model,
                     ParamSet& params) {
  auto st = safetensors::SafetensorsDir::open(dir);
  // Our names are the HF names without GPT-2's optional "transformer." prefix.
  std::map<std::string, std::string> by_short;
  for (const std::string& n : st.names()) by_short[strip_prefix(n)] = n;

  // Each parameter is staged in f64 (padding rows stay zero) and written back once.
  std::map<Param*, Tensor> staged;
  for (Param* p : params.params()) staged[p] = Tensor::zeros(p->shape, DType::kF64);
  // The experts this rank holds (the same range in every MoE layer), or null for a dense model.
  const GroupedExperts* local_experts = nullptr;
  for (const auto& layer : model.decoder->layers)
    if (layer->moe) local_experts = &layer->moe->experts;
  // gpt-oss's MXFP4 experts: dequantized from their blocks and scales.
  std::vector<std::string> mxfp4_parts;
  const HfDerivedTensors derived =
      info.model_type == "gpt_oss" ? gpt_oss_mxfp4_tensors(st, &mxfp4_parts) : HfDerivedTensors{};
  for (const auto& [name, make] : derived) by_short[name] = name;
  const std::set<std::string> used =
      read_mapped_tensors(st, by_short, build_mappings(info, model), staged, dir, derived);
  for (const auto& [short_name, full] : by_short) {
    if (used.count(short_name)) continue;
    if (std::find(mxfp4_parts.begin(), mxfp4_parts.end(), full) != mxfp4_parts.end()) continue;
    const bool mask_buffer = short_name.find(".attn.bias") != std::string::npos ||
                             short_name.find(".attn.masked_bias") != std::string::npos;
    const bool tied_head =
        short_name == "lm_head.weight" && !info.config.untie_embeddings_and_output_weights;
    const bool rotary_buffer = short_name.find("rotary_emb.inv_freq") != std::string::npos;
    // DeepSeek-V3's multi-token prediction layers carry copies of the embedding and the output
    // layer; Megatron's MTP shares the model's (mtp_embedding_copy).
    bool mtp_copy = false;
    for (const auto& [copy, shared] : deepseek_mtp_copies(info.config)) {
      if (copy != short_name) continue;
      // A copy that differs from the shared tensor would be lost: refuse it.
      MEGATRON_CHECK(
          by_short.count(shared) && same_bytes(st.read(full), st.read(by_short.at(shared))), dir,
          ": '", full, "' differs from '", shared,
          "': Megatron's multi-token prediction shares the model's embedding and "
          "output layer, so their copies must be equal");
      mtp_copy = true;
    }
    // Under expert parallelism this rank holds E / EP experts: the others' (an expert index of
    // another rank, with an expert weight's name) are for its peers.
    const bool peer_expert =
        local_experts &&
        is_peer_expert_tensor(short_name, info.config.moe.num_experts,
                              local_experts->first_expert(), local_experts->num_local());
    MEGATRON_CHECK(mask_buffer || tied_head || rotary_buffer || peer_expert || mtp_copy, dir,
                   ": unexpected tensor '", full, "' for a ", info.model_type,
                   " model as config.json describes it");
  }
  for (auto& [p, t] : staged) params.set_main(*p, t);
  params.sync_compute_from_main();
}

std::map<std::string, Tensor> to_hf_tensors(const HfModelInfo& info, const GPTModel& model,
                                            bool grads) {
  GPTModel& m = const_cast<GPTModel&>(model);  // mappings take non-const Params; nothing is written
  return mapped_hf_tensors(build_mappings(info, m), grads);
}

void save_hf(const std::string& dir, const HfModelInfo& info, const GPTModel& model) {
  std::map<std::string, Tensor> tensors = to_hf_tensors(info, model, false);
  for (const auto& [copy, shared] : deepseek_mtp_copies(model.config())) {
    tensors[copy] = tensors.at(shared);
  }
  write_hf_dir(dir, tensors, info.dtype, info.raw);
}

HfArch infer_hf_arch(const TransformerConfig& c) {
  MEGATRON_CHECK(c.moe.latent_size == 0,
                 "this model has no Hugging Face equivalent here: LatentMoE (--moe-latent-size) "
                 "is not mapped to a Hugging Face architecture");
  MEGATRON_CHECK(!c.gated_gelu && c.softmax_scale == 0,
                 "this model has no Hugging Face equivalent: GPT-2 and Llama have no GeGLU MLP "
                 "(--gated-linear-unit) and scale attention by 1/sqrt(head dim) (no "
                 "--softmax-scale)");
  // Llama 4 (the nearest) puts no L2 norm on its NoPE layers and scales their queries by the
  // position: neither Megatron variant is its model.
  MEGATRON_CHECK(!c.qk_l2_norm && c.no_rope_layers.empty(),
                 "this model has no Hugging Face equivalent: --qk-l2-norm and --no-rope-freq are "
                 "Megatron's variants of Llama 4's attention, which differs from them (no norm on "
                 "its NoPE layers, temperature-tuned NoPE queries)");
  MEGATRON_CHECK(!c.attention_output_gate,
                 "this model has no Hugging Face equivalent here: --attention-output-gate is "
                 "Qwen3-Next's gated attention, whose other layers (Gated DeltaNet) are not "
                 "implemented");
  MEGATRON_CHECK(c.mtp_num_layers == 0 || c.mla.enabled,
                 "this model has no Hugging Face equivalent: multi-token prediction layers have "
                 "a Hugging Face form in DeepSeek-V3 only (--multi-latent-attention)");
  if (looks_like_gpt_oss(c)) {
    gpt_oss_config_json(c);  // refuses, naming the flags, what gpt-oss cannot express
    return HfArch::kLlama;
  }
  if (c.mla.enabled) {  // DeepSeek-V3 (Llama's other tensors)
    MEGATRON_CHECK(c.normalization == Normalization::kRMSNorm && c.swiglu && !c.add_bias_linear &&
                       !c.add_qkv_bias,
                   "this multi-latent attention model has no Hugging Face equivalent: "
                   "DeepSeek-V3 needs --normalization RMSNorm, --swiglu and --disable-bias-linear");
    return HfArch::kLlama;
  }
  if (c.position_embedding == PositionEmbedding::kLearnedAbsolute &&
      c.normalization == Normalization::kLayerNorm && !c.swiglu && c.add_bias_linear &&
      !c.untie_embeddings_and_output_weights && c.num_query_groups == c.num_attention_heads &&
      !c.qk_layernorm && c.kv_channels * c.num_attention_heads == c.hidden_size) {
    return HfArch::kGpt2;
  }
  if (c.position_embedding == PositionEmbedding::kRope &&
      c.normalization == Normalization::kRMSNorm && c.swiglu && !c.add_bias_linear &&
      !(c.add_qkv_bias && c.qk_layernorm) && c.rotary_percent == 1.0 && !c.rotary_interleaved &&
      !(c.rope_scaling_factor > 0 && c.rotary_seq_len_interpolation_factor > 0)) {
    return HfArch::kLlama;
  }
  MEGATRON_CHECK(false,
                 "this model has no Hugging Face equivalent: GPT-2 needs learned positions, "
                 "LayerNorm, GELU, biases and tied embeddings; Llama needs "
                 "--position-embedding-type rope, --normalization RMSNorm, --swiglu and "
                 "--disable-bias-linear (--add-qkv-bias: Qwen2, without --qk-layernorm), and "
                 "rotates half-split pairs (not --rotary-interleaved) of the whole head with at "
                 "most one of --use-rope-scaling and --rotary-seq-len-interpolation-factor");
  return HfArch::kGpt2;
}

namespace {

// The MoE keys of a Mixtral, Qwen2-MoE or Qwen3-MoE config.json (Llama's keys are already in j).
void add_hf_moe_keys(const TransformerConfig& c, json& j) {
  // Qwen2-MoE with a gated shared expert, Qwen3-MoE when the heads have q/k norms (it has them
  // always), else Mixtral (every layer MoE, softmax over the k selected). Routers Hugging Face
  // cannot express have no export.
  const MoeConfig& m = c.moe;
  const bool qwen2 = m.shared_expert_intermediate_size > 0;
  MEGATRON_CHECK(!qwen2 || (m.shared_expert_gate && !c.qk_layernorm && c.add_qkv_bias),
                 "this MoE model has no Hugging Face equivalent: shared experts export as "
                 "Qwen2-MoE's, which gates them (--moe-shared-expert-gate), has q/k/v biases "
                 "(--add-qkv-bias; older transformers always build them) and no q/k norms "
                 "(--qk-layernorm)");
  MEGATRON_CHECK(!m.apply_probs_on_input,
                 "this MoE model has no Hugging Face equivalent here: Mixtral and Qwen3-MoE scale "
                 "the experts' outputs by the routing probabilities, not their inputs "
                 "(--moe-apply-probs-on-input)");
  MEGATRON_CHECK(m.score_function == MoeScoreFunction::kSoftmax && m.topk_scaling_factor == 0 &&
                     m.group_topk == 0 && !m.enable_expert_bias &&
                     !m.has(MoeLoadBalancing::kSinkhorn),
                 "this MoE model has no Hugging Face equivalent: Mixtral and Qwen2/3-MoE route by "
                 "softmax top-k without scaling, groups, expert bias or sinkhorn");
  MEGATRON_CHECK(!c.add_qkv_bias || qwen2,
                 "this MoE model has no Hugging Face equivalent: of the MoE forms only Qwen2-MoE "
                 "has q/k/v biases (--add-qkv-bias), with a gated shared expert");
  const bool mixtral = !c.qk_layernorm && !qwen2;
  MEGATRON_CHECK(!mixtral || (m.num_moe_layers(c.num_layers) == c.num_layers && !m.pre_softmax),
                 "this MoE model has no Hugging Face equivalent: Mixtral has MoE in every layer "
                 "(--moe-layer-freq 1) and renormalises over the k (no --moe-router-pre-softmax); "
                 "dense layers or pre-softmax need --qk-layernorm (Qwen3-MoE)");
  j["model_type"] = mixtral ? "mixtral" : qwen2 ? "qwen2_moe" : "qwen3_moe";
  j["architectures"] = {mixtral ? "MixtralForCausalLM"
                        : qwen2 ? "Qwen2MoeForCausalLM"
                                : "Qwen3MoeForCausalLM"};
  if (qwen2) {
    j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
    j["qkv_bias"] = c.add_qkv_bias;
  }
  j["num_experts_per_tok"] = c.moe.router_topk;
  j["router_aux_loss_coef"] = 0.0;
  if (mixtral) {
    j["num_local_experts"] = c.moe.num_experts;
    j["intermediate_size"] = c.moe.ffn_hidden_size;
    j["sliding_window"] = nullptr;
  } else {
    j["num_experts"] = c.moe.num_experts;
    j["moe_intermediate_size"] = c.moe.ffn_hidden_size;
    j["intermediate_size"] = c.ffn_hidden_size;
    j["norm_topk_prob"] = !c.moe.pre_softmax;
    j["decoder_sparse_step"] = 1;
    std::vector<int64_t> dense;
    for (int64_t i = 0; i < c.num_layers; ++i)
      if (!c.moe.is_moe_layer(i)) dense.push_back(i);
    j["mlp_only_layers"] = dense;
  }
}

}  // namespace

HfModelInfo hf_info_from_config(const TransformerConfig& c, HfArch arch) {
  HfModelInfo info;
  info.arch = arch;
  info.config = c;
  json& j = info.raw;
  if (arch == HfArch::kGpt2) {
    j = {{"model_type", "gpt2"},
         {"architectures", {"GPT2LMHeadModel"}},
         {"n_layer", c.num_layers},
         {"n_embd", c.hidden_size},
         {"n_head", c.num_attention_heads},
         {"n_inner", c.ffn_hidden_size},
         {"n_positions", c.max_position_embeddings},
         {"vocab_size", c.vocab_size},
         {"layer_norm_epsilon", c.norm_epsilon},
         {"activation_function", c.squared_relu  ? "relu2"
                                 : c.openai_gelu ? "gelu_new"
                                                 : "gelu"},
         {"tie_word_embeddings", true}};
  } else if (c.mla.enabled) {
    j = deepseek_v3_config_json(c);
  } else if (looks_like_gpt_oss(c)) {
    j = gpt_oss_config_json(c);
  } else {
    // Llama's keys, which Mixtral and Qwen3(-MoE) share.
    j = {{"num_hidden_layers", c.num_layers},
         {"hidden_size", c.hidden_size},
         {"num_attention_heads", c.num_attention_heads},
         {"num_key_value_heads", c.num_query_groups},
         {"head_dim", c.kv_channels},
         {"intermediate_size", c.ffn_hidden_size},
         {"max_position_embeddings", c.max_position_embeddings},
         {"vocab_size", c.vocab_size},
         {"rms_norm_eps", c.norm_epsilon},
         {"rope_theta", c.rotary_base},
         {"rope_scaling", nullptr},
         {"hidden_act", "silu"},
         {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
         {"attention_bias", false}};
    if (c.heterogeneous.enabled()) {
      add_nemotron_nas_keys(c, j);
    } else if (!c.moe.enabled()) {
      // Qwen2 is Llama with biases on q, k and v.
      j["model_type"] = c.qk_layernorm ? "qwen3" : c.add_qkv_bias ? "qwen2" : "llama";
      j["architectures"] = {c.qk_layernorm   ? "Qwen3ForCausalLM"
                            : c.add_qkv_bias ? "Qwen2ForCausalLM"
                                             : "LlamaForCausalLM"};
      // (Hugging Face's Qwen2 has the biases always; this import reads the key for it.)
      if (c.add_qkv_bias) j["attention_bias"] = true;
      j["mlp_bias"] = false;
    } else {
      add_hf_moe_keys(c, j);
    }
  }
  if (c.rope_scaling_factor > 0) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling_factor},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  } else if (c.rotary_seq_len_interpolation_factor > 0) {
    j["rope_scaling"] = {{"rope_type", "linear"},
                         {"factor", c.rotary_seq_len_interpolation_factor}};
  }
  j["torch_dtype"] = torch_dtype_name(info.dtype);
  info.model_type = j["model_type"].get<std::string>();
  return info;
}

}  // namespace megatron
