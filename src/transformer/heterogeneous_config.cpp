// Reading Llama-Nemotron block lists as Megatron's HeterogeneousTransformerConfig does.
#include "transformer/heterogeneous_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megatron {

namespace {

nlohmann::json parse_json(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  MEGATRON_CHECK(!j.is_discarded(), source,
                 " is not valid JSON: give a Llama-Nemotron config.json with a "
                 "\"block_configs\" list");
  return j;
}

// A value of the wrong JSON type (a string where a number belongs) becomes an error naming the
// source instead of the JSON library's.
template <typename Fn>
auto reading(const std::string& source, Fn&& fn) {
  try {
    return fn();
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(detail::concat(source, ": a value has the wrong type (", e.what(),
                                         "); compare it with a Llama-Nemotron config.json"));
  }
}

bool flag_of(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return false;
  MEGATRON_CHECK(j[key].is_boolean(), where, ".", key, " must be true or false, got ",
                 j[key].dump());
  return j[key].get<bool>();
}

// A key that changes the layer but that Megatron's block reading drops: refused unless absent,
// null, false or empty.
void refuse_if_set(const nlohmann::json& j, const char* key, const std::string& where,
                   const char* what) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j[key];
  const bool unset = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                     ((v.is_array() || v.is_object()) && v.empty());
  MEGATRON_CHECK(unset, where, ".", key, " = ", v.dump(), ": ", what,
                 " is not implemented (Megatron's heterogeneous layers are whole, linear or "
                 "no-op attention and MLP blocks)");
}

BranchKind kind_of(const nlohmann::json& j, const std::string& where) {
  const bool no_op = flag_of(j, "no_op", where);
  const bool linear = flag_of(j, "replace_with_linear", where);
  MEGATRON_CHECK(!(no_op && linear), where, " has both no_op and replace_with_linear: choose one");
  return no_op ? BranchKind::kNoOp : linear ? BranchKind::kLinear : BranchKind::kWhole;
}

}  // namespace

int64_t ffn_mult_to_intermediate_size(double ffn_mult, int64_t hidden_size) {
  // Python's int() truncates toward zero; the product is positive here.
  const auto n = static_cast<int64_t>(2.0 * ffn_mult * static_cast<double>(hidden_size) / 3.0);
  return n % 256 == 0 ? n : n + 256 - n % 256;
}

HeterogeneousConfig parse_heterogeneous_config(const std::string& json_text,
                                               int64_t num_attention_heads, int64_t hidden_size,
                                               const std::string& source) {
  return reading(source, [&] {
    const nlohmann::json j = parse_json(json_text, source);
    MEGATRON_CHECK(j.is_object() && j.contains("block_configs") && j["block_configs"].is_array() &&
                       !j["block_configs"].empty(),
                   source, " has no \"block_configs\" list: give a Llama-Nemotron config.json");
    HeterogeneousConfig out;
    out.json = json_text;
    const nlohmann::json& list = j["block_configs"];
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = source + ": block_configs[" + std::to_string(i) + "]";
      const nlohmann::json& b = list[i];
      MEGATRON_CHECK(b.is_object() && b.contains("attention") && b["attention"].is_object(), where,
                     " needs an \"attention\" object");
      const nlohmann::json* ffn = nullptr;
      if (b.contains("ffn") && b["ffn"].is_object()) ffn = &b["ffn"];
      if (!ffn && b.contains("mlp") && b["mlp"].is_object()) ffn = &b["mlp"];
      MEGATRON_CHECK(ffn != nullptr, where, " needs an \"ffn\" (or \"mlp\") object");

      HeterogeneousBlock block;
      const nlohmann::json& a = b["attention"];
      const std::string aw = where + ".attention";
      block.attention = kind_of(a, aw);
      for (const char* key : {"sparsify", "window_length", "num_sink_tokens", "unshifted_sink",
                              "use_prefill_window_in_sink_attention", "prefill_sliding_window",
                              "is_mamba", "mamba", "llama4"})
        refuse_if_set(a, key, aw, key);
      if (a.contains("num_query_groups") && !a["num_query_groups"].is_null()) {
        block.num_query_groups = a["num_query_groups"].get<int64_t>();
      } else if (a.contains("num_key_value_heads") && !a["num_key_value_heads"].is_null()) {
        // Newer DeciLM block lists give the key/value heads themselves.
        block.num_query_groups = a["num_key_value_heads"].get<int64_t>();
      } else if (a.contains("n_heads_in_group") && !a["n_heads_in_group"].is_null()) {
        const int64_t per_group = a["n_heads_in_group"].get<int64_t>();
        MEGATRON_CHECK(per_group > 0 && num_attention_heads % per_group == 0, aw,
                       ".n_heads_in_group = ", per_group, ": --num-attention-heads (",
                       num_attention_heads, ") must be a multiple of it (Megatron's check)");
        block.num_query_groups = num_attention_heads / per_group;
      }
      MEGATRON_CHECK(block.num_query_groups >= 0, aw, ": query groups must be positive");
      MEGATRON_CHECK(block.num_query_groups == 0 || block.attention == BranchKind::kWhole, aw,
                     " sets query groups on a ",
                     block.attention == BranchKind::kNoOp ? "no-op" : "linear",
                     " attention (Megatron asserts they go together only with whole attention)");

      const std::string fw = where + (b.contains("ffn") ? ".ffn" : ".mlp");
      block.mlp = kind_of(*ffn, fw);
      for (const char* key : {"sparsify", "moe", "is_moe"}) refuse_if_set(*ffn, key, fw, key);
      if (ffn->contains("gated")) {
        MEGATRON_CHECK((*ffn)["gated"].is_null() || (*ffn)["gated"] == true, fw,
                       ".gated = false: an ungated MLP is not implemented (Megatron's "
                       "heterogeneous layers are SwiGLU)");
      }
      if (ffn->contains("hidden_act") && !(*ffn)["hidden_act"].is_null()) {
        MEGATRON_CHECK((*ffn)["hidden_act"] == "silu", fw,
                       ".hidden_act = ", (*ffn)["hidden_act"].dump(),
                       ": only silu (SwiGLU) is implemented, as Megatron requires");
      }
      if (ffn->contains("ffn_hidden_size") && !(*ffn)["ffn_hidden_size"].is_null()) {
        block.ffn_hidden_size = (*ffn)["ffn_hidden_size"].get<int64_t>();
      } else if (ffn->contains("intermediate_size") && !(*ffn)["intermediate_size"].is_null()) {
        block.ffn_hidden_size = (*ffn)["intermediate_size"].get<int64_t>();
      } else if (ffn->contains("ffn_mult") && !(*ffn)["ffn_mult"].is_null()) {
        const double mult = (*ffn)["ffn_mult"].get<double>();
        MEGATRON_CHECK(mult > 0, fw, ".ffn_mult must be positive, got ", mult);
        block.ffn_hidden_size = ffn_mult_to_intermediate_size(mult, hidden_size);
      }
      MEGATRON_CHECK(block.ffn_hidden_size >= 0, fw, ": the MLP width must be positive");
      MEGATRON_CHECK(block.ffn_hidden_size == 0 || block.mlp == BranchKind::kWhole, fw,
                     " sets an MLP width on a ",
                     block.mlp == BranchKind::kNoOp ? "no-op" : "linear",
                     " MLP (Megatron asserts they go together only with a whole MLP)");
      out.blocks.push_back(block);
    }
    return out;
  });
}

HeterogeneousModelArgs heterogeneous_model_args(const std::string& json_text,
                                                const std::string& source) {
  return reading(source, [&] {
    const nlohmann::json j = parse_json(json_text, source);
    HeterogeneousModelArgs m;
    auto need = [&](const char* key) -> const nlohmann::json& {
      MEGATRON_CHECK(j.contains(key) && !j[key].is_null(), source, " has no \"", key,
                     "\": Megatron checks the flags against the whole Llama-Nemotron config.json");
      return j[key];
    };
    m.hidden_act = need("hidden_act").get<std::string>();
    m.num_hidden_layers = need("num_hidden_layers").get<int64_t>();
    m.hidden_size = need("hidden_size").get<int64_t>();
    m.num_attention_heads = need("num_attention_heads").get<int64_t>();
    m.tie_word_embeddings = j.value("tie_word_embeddings", false);
    m.rope_theta = need("rope_theta").get<double>();
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object() &&
        j["rope_scaling"].contains("factor")) {
      m.has_rope_scaling = true;
      m.rope_scaling_factor = j["rope_scaling"]["factor"].get<double>();
    }
    for (const nlohmann::json& b : need("block_configs")) {
      if (!b.contains("attention")) continue;
      const nlohmann::json& a = b["attention"];
      if (!a.contains("n_heads_in_group") || a["n_heads_in_group"].is_null()) continue;
      const int64_t per_group = a["n_heads_in_group"].get<int64_t>();
      if (per_group > 0) m.num_query_groups = m.num_attention_heads / per_group;
      break;  // the first one, as Megatron's check takes
    }
    return m;
  });
}

}  // namespace megatron
