// The heterogeneous-layers flags' rules: Megatron's
// validate_model_config_args_from_heterogeneous_config. Its model (HeterogeneousTransformerConfig)
// reads only the block list; its argument check makes the flags restate the whole config.json, so
// that a Llama-Nemotron launch script is the model's description twice over. Both are kept.
#include <fstream>
#include <sstream>

#include "cli/train_args.h"
#include "core/error.h"
#include "transformer/heterogeneous_config.h"

namespace megatron::cli {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MEGATRON_CHECK(in.good(), "--heterogeneous-layers-config-path: cannot read '", path,
                 "': give the Llama-Nemotron config.json");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

template <typename T>
std::string shown(const T& v) {
  std::ostringstream os;
  os << std::boolalpha << v;
  return os.str();
}

}  // namespace

void validate_heterogeneous_args(Arguments& a) {
  if (a.heterogeneous_layers_config_path.empty() &&
      a.heterogeneous_layers_config_encoded_json.empty())
    return;
  const std::string source =
      a.heterogeneous_layers_config_encoded_json.empty()
          ? "--heterogeneous-layers-config-path " + a.heterogeneous_layers_config_path
          : std::string("--heterogeneous-layers-config-encoded-json");
  if (a.heterogeneous_layers_config_encoded_json.empty())
    a.heterogeneous_layers_config_encoded_json = read_text(a.heterogeneous_layers_config_path);
  MEGATRON_CHECK(a.model == "gpt", source,
                 " shapes GPT models (Megatron's pretrain_gpt), not --model ", a.model);
  const HeterogeneousModelArgs m =
      heterogeneous_model_args(a.heterogeneous_layers_config_encoded_json, source);
  MEGATRON_CHECK(m.hidden_act == "silu", source, ": hidden_act in heterogeneous config is ",
                 m.hidden_act, ", should be silu");
  MEGATRON_CHECK(m.has_rope_scaling, source,
                 " has no rope_scaling factor: Megatron's heterogeneous models are Llama 3.1 "
                 "derivatives run with --use-rope-scaling and its --rope-scaling-factor");
  // Megatron's list, in its order: flag, this run's value, the config's.
  std::vector<std::string> differ;
  auto expect = [&](const char* flag, const auto& given, const auto& wanted) {
    if (!(given == wanted))
      differ.push_back(std::string(flag) + " " + shown(given) + " (provided) != " + shown(wanted) +
                       " (expected)");
  };
  expect("--swiglu", a.swiglu, true);
  expect("--normalization", a.normalization, std::string("RMSNorm"));
  expect("--group-query-attention", a.group_query_attention, true);
  expect("--position-embedding-type", a.position_embedding_type, std::string("rope"));
  expect("--rotary-percent", a.rotary_percent, 1.0);
  expect("--use-rope-scaling", a.use_rope_scaling, true);
  expect("--use-rotary-position-embeddings", a.use_rotary_position_embeddings, true);
  expect("--num-layers", a.num_layers, m.num_hidden_layers);
  expect("--hidden-size", a.hidden_size, m.hidden_size);
  expect("--num-attention-heads", a.num_attention_heads, m.num_attention_heads);
  expect("--untie-embeddings-and-output-weights", a.untie_embeddings_and_output_weights,
         !m.tie_word_embeddings);
  expect("--rotary-base", a.rotary_base, m.rope_theta);
  expect("--rope-scaling-factor", a.rope_scaling_factor, m.rope_scaling_factor);
  if (m.num_query_groups > 0) expect("--num-query-groups", a.num_query_groups, m.num_query_groups);
  if (!differ.empty()) {
    std::string all;
    for (const std::string& d : differ) all += (all.empty() ? "" : ", ") + d;
    MEGATRON_CHECK(false, "Arguments differ from heterogeneous config (", source, "): ", all);
  }
  // The block list itself (sizes, kinds, refused keys); the model reads it again.
  parse_heterogeneous_config(a.heterogeneous_layers_config_encoded_json, a.num_attention_heads,
                             a.hidden_size, source);
}

}  // namespace megatron::cli
