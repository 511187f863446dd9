// gpt-oss's Hugging Face layout: see the header.
#include "models/gpt/gpt_oss_hf.h"

#include <cmath>
#include <cstdio>
#include <set>

#include "transformer/mla_config.h"

namespace megatron {
using nlohmann::json;

namespace {

// Hugging Face's default attention factor of YaRN, 0.1 ln(factor) + 1, and with DeepSeek's
// mscale keys their ratio: Megatron's concentration factor with --mscale m, --mscale-all-dim a.
double yarn_attention_factor(double factor, double m, double a) {
  return MlaConfig::yarn_mscale(factor, m) / MlaConfig::yarn_mscale(factor, a);
}

void read_rope_scaling(const json& j, const std::string& file, TransformerConfig& c) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) {
    c.position_embedding = PositionEmbedding::kRope;
    return;
  }
  const json& rs = j["rope_scaling"];
  const std::string type =
      hf_get_or<std::string>(rs, "rope_type", hf_get_or<std::string>(rs, "type", "", file), file);
  MEGATRON_CHECK(type == "yarn", file, ": rope_scaling type '", type,
                 "' is not supported for gpt_oss (yarn, or none)");
  c.position_embedding = PositionEmbedding::kYarn;
  c.yarn_factor = hf_get<double>(rs, "factor", file);
  c.yarn_beta_fast = hf_get_or<double>(rs, "beta_fast", 32.0, file);
  c.yarn_beta_slow = hf_get_or<double>(rs, "beta_slow", 1.0, file);
  // transformers' _compute_yarn_parameters: with original_max_position_embeddings the factor is
  // max_position_embeddings / original (gpt-oss's files agree with their "factor"); without it
  // the original context is max_position_embeddings.
  const double max_positions = hf_get<double>(j, "max_position_embeddings", file);
  if (rs.contains("original_max_position_embeddings") &&
      !rs["original_max_position_embeddings"].is_null()) {
    c.yarn_original_max_positions = hf_get<double>(rs, "original_max_position_embeddings", file);
    const double ratio = max_positions / c.yarn_original_max_positions;
    if (std::fabs(ratio - c.yarn_factor) > 1e-9 * ratio) {
      std::fprintf(stderr,
                   "WARNING: %s: rope_scaling factor %g differs from max_position_embeddings / "
                   "original_max_position_embeddings = %g, which Hugging Face's YaRN uses; "
                   "so does this run\n",
                   file.c_str(), c.yarn_factor, ratio);
      c.yarn_factor = ratio;
    }
  } else {
    c.yarn_original_max_positions = max_positions;
  }
  MEGATRON_CHECK(c.yarn_factor >= 1, file, ": rope_scaling factor must be >= 1, got ",
                 c.yarn_factor);
  // Hugging Face's truncate (default true) rounds the correction range outwards, as Megatron's
  // --yarn-correction-range-round-to-int; gpt-oss's configs say false.
  c.yarn_round_to_int = hf_get_or<bool>(rs, "truncate", true, file);
  // The attention factor: with both of DeepSeek's mscale keys (nonzero) their ratio, Megatron's
  // --mscale and --mscale-all-dim; otherwise 0.1 ln(factor) + 1 (mscale 1, mscale_all_dim 0),
  // as transformers computes it.
  const double m = hf_get_or<double>(rs, "mscale", 0.0, file);
  const double m_all = hf_get_or<double>(rs, "mscale_all_dim", 0.0, file);
  c.yarn_mscale = m != 0 && m_all != 0 ? m : 1.0;
  c.yarn_mscale_all_dim = m != 0 && m_all != 0 ? m_all : 0.0;
  if (rs.contains("attention_factor") && !rs["attention_factor"].is_null()) {
    // A given factor: Megatron's concentration factor is mscale / 1 for mscale_all_dim 0 when
    // yarn_mscale(f, mscale) equals it, i.e. mscale = (factor - 1) / (0.1 ln f).
    const double given = hf_get<double>(rs, "attention_factor", file);
    const double ours = yarn_attention_factor(c.yarn_factor, c.yarn_mscale, c.yarn_mscale_all_dim);
    if (std::fabs(given - ours) > 1e-12 * ours) {
      MEGATRON_CHECK(c.yarn_factor > 1, file, ": rope_scaling attention_factor ", given,
                     " with factor 1 has no Megatron form (its YaRN factor is 1 there)");
      c.yarn_mscale = (given - 1) / (0.1 * std::log(c.yarn_factor));
      c.yarn_mscale_all_dim = 0;
    }
  }
}

// gate_up_proj's columns (gate j at 2j, up j at 2j + 1) -> fc1's rows [gate | up].
std::vector<int64_t> interleaved_fc1_rows(int64_t f) {
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < f; ++j) {
    rows.push_back(j);
    rows.push_back(f + j);
  }
  return rows;
}

}  // namespace

void read_gpt_oss_config(const json& j, const std::string& file, TransformerConfig& c) {
  c.num_layers = hf_get<int64_t>(j, "num_hidden_layers", file);
  c.hidden_size = hf_get<int64_t>(j, "hidden_size", file);
  c.num_attention_heads = hf_get<int64_t>(j, "num_attention_heads", file);
  c.num_query_groups = hf_get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, file);
  c.kv_channels = hf_get_or<int64_t>(j, "head_dim", 64, file);
  c.max_position_embeddings = hf_get<int64_t>(j, "max_position_embeddings", file);
  c.vocab_size = hf_get<int64_t>(j, "vocab_size", file);
  c.norm_epsilon = hf_get_or<double>(j, "rms_norm_eps", 1e-5, file);
  c.rotary_base = hf_get_or<double>(j, "rope_theta", 150000.0, file);
  c.normalization = Normalization::kRMSNorm;
  // GptOssConfig sets attention_bias true whatever the file says; the experts and the router
  // have biases too: Megatron's --add-bias-linear (its default) covers them all.
  c.add_bias_linear = true;
  c.untie_embeddings_and_output_weights = !hf_get_or<bool>(j, "tie_word_embeddings", false, file);
  read_rope_scaling(j, file, c);
  // Attention sinks, one learned logit per head.
  c.softmax_type = SoftmaxType::kLearnable;
  // The sliding layers: Hugging Face's window of W keys includes the query's own.
  const int64_t window = hf_get_or<int64_t>(j, "sliding_window", 128, file);
  std::vector<std::string> types;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    types = hf_get<std::vector<std::string>>(j, "layer_types", file);
    MEGATRON_CHECK(static_cast<int64_t>(types.size()) == c.num_layers, file, ": layer_types has ",
                   types.size(), " entries for ", c.num_layers, " layers");
  } else {  // GptOssConfig's default: sliding, full, sliding, ...
    for (int64_t i = 0; i < c.num_layers; ++i)
      types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  }
  bool any = false;
  for (const std::string& t : types) {
    MEGATRON_CHECK(t == "sliding_attention" || t == "full_attention", file, ": layer_types entry '",
                   t, "' is not supported (sliding_attention, full_attention)");
    c.window_layers.push_back(t == "sliding_attention" ? 1 : 0);
    any = any || t == "sliding_attention";
  }
  if (any) {
    MEGATRON_CHECK(window >= 1, file, ": sliding_window must be >= 1, got ", window);
    c.window_attention = true;
    c.window_left = window - 1;
  } else {
    c.window_layers.clear();
  }
  // The MLP: every layer an MoE of quick-GeGLU experts.
  MoeConfig& m = c.moe;
  m.num_experts = hf_get<int64_t>(j, "num_local_experts", file);
  m.router_topk = hf_get_or<int64_t>(j, "num_experts_per_tok",
                                     hf_get_or<int64_t>(j, "experts_per_token", 4, file), file);
  m.ffn_hidden_size = hf_get<int64_t>(j, "intermediate_size", file);
  m.aux_loss_coeff = {
      0.0};  // HF's router_aux_loss_coef is a training choice (--moe-aux-loss-coeff)
  c.ffn_hidden_size = m.ffn_hidden_size;
  c.quick_geglu = true;
  c.glu_linear_offset = 1.0;
  c.activation_clamp = hf_get_or<double>(j, "swiglu_limit", 7.0, file);
  MEGATRON_CHECK(c.activation_clamp > 0, file, ": swiglu_limit must be positive");
}

bool looks_like_gpt_oss(const TransformerConfig& c) {
  return c.quick_geglu || c.softmax_type != SoftmaxType::kVanilla ||
         c.position_embedding == PositionEmbedding::kYarn || c.window_attention;
}

json gpt_oss_config_json(const TransformerConfig& c) {
  const MoeConfig& m = c.moe;
  const char* why =
      "this model has no Hugging Face equivalent: sinks, quick GeGLU, YaRN and sliding windows on "
      "ordinary attention are gpt-oss's, which needs ";
  MEGATRON_CHECK(c.normalization == Normalization::kRMSNorm && c.add_bias_linear && c.quick_geglu &&
                     c.glu_linear_offset == 1.0 && c.activation_clamp > 0 &&
                     c.softmax_type == SoftmaxType::kLearnable && !c.qk_layernorm && !c.qk_l2_norm,
                 why,
                 "--normalization RMSNorm, biases (no --disable-bias-linear), --quick-geglu "
                 "--glu-linear-offset 1 --activation-func-clamp-value, --softmax-type learnable, "
                 "no query/key norms");
  MEGATRON_CHECK(m.enabled() && m.num_moe_layers(c.num_layers) == c.num_layers &&
                     m.score_function == MoeScoreFunction::kSoftmax && !m.pre_softmax &&
                     m.topk_scaling_factor == 0 && m.group_topk == 0 && !m.enable_expert_bias &&
                     m.shared_expert_intermediate_size == 0 && !m.apply_probs_on_input &&
                     !m.has(MoeLoadBalancing::kSinkhorn),
                 why,
                 "MoE in every layer, routed by softmax over the top-k logits (no pre-softmax, "
                 "scaling, groups, expert bias, shared experts or probabilities on the input)");
  MEGATRON_CHECK((c.position_embedding == PositionEmbedding::kRope ||
                  c.position_embedding == PositionEmbedding::kYarn) &&
                     c.rotary_percent == 1.0 && !c.rotary_interleaved &&
                     c.rope_scaling_factor == 0 && c.rotary_seq_len_interpolation_factor == 0 &&
                     c.no_rope_layers.empty() && c.mtp_num_layers == 0 &&
                     !c.heterogeneous.enabled(),
                 why,
                 "RoPE or YaRN over the whole head in half-split pairs and no other positional "
                 "variant, no multi-token prediction");
  json j = {{"model_type", "gpt_oss"},
            {"architectures", {"GptOssForCausalLM"}},
            {"num_hidden_layers", c.num_layers},
            {"hidden_size", c.hidden_size},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_query_groups},
            {"head_dim", c.kv_channels},
            {"intermediate_size", m.ffn_hidden_size},
            {"num_local_experts", m.num_experts},
            {"num_experts_per_tok", m.router_topk},
            {"experts_per_token", m.router_topk},
            {"max_position_embeddings", c.max_position_embeddings},
            {"vocab_size", c.vocab_size},
            {"rms_norm_eps", c.norm_epsilon},
            {"rope_theta", c.rotary_base},
            {"rope_scaling", nullptr},
            {"swiglu_limit", c.activation_clamp},
            {"hidden_act", "silu"},
            {"attention_bias", true},
            {"attention_dropout", 0.0},
            {"router_aux_loss_coef", 0.0},
            {"output_router_logits", false},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights}};
  if (c.position_embedding == PositionEmbedding::kYarn) {
    // transformers takes YaRN's factor as max_position_embeddings /
    // original_max_position_embeddings (read_rope_scaling): the written context is the one that
    // gives this factor.
    const double context = c.yarn_original_max_positions * c.yarn_factor;
    MEGATRON_CHECK(
        std::fabs(context - std::round(context)) < 1e-9 * context,
        "this model has no Hugging Face gpt_oss form: transformers derives YaRN's factor "
        "from max_position_embeddings / original_max_position_embeddings, and "
        "--rotary-scaling-factor (",
        c.yarn_factor, ") x --yarn-original-max-position-embeddings (",
        c.yarn_original_max_positions, ") is no whole number of positions");
    j["max_position_embeddings"] = static_cast<int64_t>(std::llround(context));
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", c.yarn_factor},
                         {"beta_fast", c.yarn_beta_fast},
                         {"beta_slow", c.yarn_beta_slow},
                         {"original_max_position_embeddings", c.yarn_original_max_positions},
                         {"truncate", c.yarn_round_to_int}};
    // Other mscales than YaRN's default factor: the factor itself, which transformers takes as
    // given (its mscale keys alone would be ignored unless both are nonzero).
    if (c.yarn_mscale != 1.0 || c.yarn_mscale_all_dim != 0.0) {
      j["rope_scaling"]["attention_factor"] =
          yarn_attention_factor(c.yarn_factor, c.yarn_mscale, c.yarn_mscale_all_dim);
    }
  }
  // layer_types and the window (Hugging Face's W counts the query).
  std::vector<std::string> types;
  for (int64_t i = 0; i < c.num_layers; ++i)
    types.push_back(c.attention_window(i) >= 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["sliding_window"] = c.window_attention ? c.window_left + 1 : 128;
  return j;
}

void add_gpt_oss_layer_mappings(const TransformerConfig& c, TransformerLayer& L,
                                const std::string& p, std::vector<HfTensorMapping>& maps) {
  const int64_t h = c.hidden_size, hn = c.head_dim(), np = c.num_attention_heads,
                ng = c.num_query_groups, E = c.moe.num_experts, f = c.moe.ffn_hidden_size;
  auto add = [&](const std::string& name, Param& param, Shape shape, bool transpose = false,
                 std::vector<int64_t> rows = {}, int64_t slice = -1) {
    HfTensorMapping mp{name, &param, 0, std::move(rows), transpose, shape, 0.0};
    if (slice >= 0) {
      mp.slice = slice;
      mp.slices = E;
    }
    maps.push_back(std::move(mp));
  };
  SelfAttention& a = *L.self_attention;
  add(p + "input_layernorm.weight", L.input_layernorm->weight, {h});
  const char* parts[] = {"q_proj", "k_proj", "v_proj"};
  for (int part = 0; part < 3; ++part) {
    const int64_t out = (part == 0 ? np : ng) * hn;
    add(p + "self_attn." + parts[part] + ".weight", a.linear_qkv->weight(), {out, h}, false,
        packed_qkv_rows(c, part));
    add(p + "self_attn." + parts[part] + ".bias", a.linear_qkv->bias(), {out}, false,
        packed_qkv_rows(c, part));
  }
  add(p + "self_attn.o_proj.weight", a.linear_proj.weight(), {h, np * hn});
  add(p + "self_attn.o_proj.bias", a.linear_proj.bias, {h});
  add(p + "self_attn.sinks", *a.softmax_offset, {np});
  add(p + "post_attention_layernorm.weight", L.pre_mlp_layernorm->weight, {h});
  MoELayer& moe = *L.moe;
  add(p + "mlp.router.weight", moe.router.weight, {E, h});
  add(p + "mlp.router.bias", moe.router.bias, {E});
  const std::vector<int64_t> fc1_rows = interleaved_fc1_rows(f);
  const std::string x = p + "mlp.experts.";
  // Each stacked tensor's slices consecutively, so that the loader reads it once.
  for (int64_t e = 0; e < moe.experts.num_local(); ++e)
    add(x + "gate_up_proj", moe.experts.fc1(e), {h, 2 * f}, true, fc1_rows,
        moe.experts.first_expert() + e);
  for (int64_t e = 0; e < moe.experts.num_local(); ++e)
    add(x + "gate_up_proj_bias", moe.experts.fc1_bias(e), {2 * f}, false, fc1_rows,
        moe.experts.first_expert() + e);
  for (int64_t e = 0; e < moe.experts.num_local(); ++e)
    add(x + "down_proj", moe.experts.fc2(e), {f, h}, true, {}, moe.experts.first_expert() + e);
  for (int64_t e = 0; e < moe.experts.num_local(); ++e)
    add(x + "down_proj_bias", moe.experts.fc2_bias(e), {h}, false, {},
        moe.experts.first_expert() + e);
}

Tensor dequantize_mxfp4(const Tensor& blocks, const Tensor& scales) {
  MEGATRON_CHECK(blocks.dtype() == DType::kU8 && scales.dtype() == DType::kU8 &&
                     blocks.ndim() >= 2 && blocks.dim(-1) == 16 &&
                     scales.numel() * 16 == blocks.numel(),
                 "MXFP4: blocks must be u8 [..., G, 16] and scales u8 [..., G], got ", blocks.str(),
                 " and ", scales.str());
  // E2M1's sixteen codes (sign, two exponent bits, one mantissa bit).
  static constexpr float kE2M1[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  std::vector<int64_t> dims;
  for (int i = 0; i < blocks.ndim() - 2; ++i) dims.push_back(blocks.dim(i));
  dims.push_back(blocks.dim(-2) * 32);
  Tensor out = Tensor::empty(Shape(dims.begin(), dims.end()), DType::kF32);
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  float* o = out.data<float>();
  for (int64_t g = 0; g < scales.numel(); ++g) {
    // E8M0: 2^(s - 127), as Hugging Face's ldexp.
    const float scale = std::ldexp(1.0f, static_cast<int>(s[g]) - 127);
    for (int64_t k = 0; k < 16; ++k) {
      const uint8_t byte = b[g * 16 + k];
      o[g * 32 + 2 * k] = kE2M1[byte & 0x0F] * scale;  // low nibble first
      o[g * 32 + 2 * k + 1] = kE2M1[byte >> 4] * scale;
    }
  }
  return out;
}

HfDerivedTensors gpt_oss_mxfp4_tensors(const safetensors::SafetensorsDir& st,
                                       std::vector<std::string>* parts) {
  HfDerivedTensors derived;
  const std::string suffix = "_blocks";
  const std::vector<std::string> names = st.names();
  const std::set<std::string> present(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string base = name.substr(0, name.size() - suffix.size());
    const std::string scales = base + "_scales";
    MEGATRON_CHECK(present.count(scales) != 0, "MXFP4 tensor '", name, "' has no '", scales,
                   "' beside it");
    parts->push_back(name);
    parts->push_back(scales);
    derived[base] = [&st, name, scales]() {
      // [E, rows, G, 16] -> [E, rows, G 32] -> [E, G 32, rows]: Hugging Face's layout, input
      // dimension first, as the unquantized tensors are stored.
      const Tensor v = dequantize_mxfp4(st.read(name), st.read(scales));
      MEGATRON_CHECK(v.ndim() == 3, "MXFP4 tensor '", name, "': expected [experts, rows, G, 16]");
      const int64_t E = v.dim(0), R = v.dim(1), C = v.dim(2);
      Tensor t = Tensor::empty({E, C, R}, DType::kF32);
      const float* src = v.data<float>();
      float* dst = t.data<float>();
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c) dst[(e * C + c) * R + r] = src[(e * R + r) * C + c];
      return t;
    };
  }
  return derived;
}

}  // namespace megatron
