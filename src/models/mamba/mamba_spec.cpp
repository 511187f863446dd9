// Hybrid Mamba spec: GPT's chunks, loss and data with the hybrid layers; Megatron's hybrid FLOPs.
#include "models/mamba/mamba_spec.h"

#include <algorithm>

#include "core/error.h"
#include "models/gpt/gpt_spec.h"

namespace megatron {

double hybrid_flops_per_iteration(const TransformerConfig& c, int64_t global_batch_size) {
  const double B = static_cast<double>(global_batch_size), s = static_cast<double>(c.seq_length);
  const double h = static_cast<double>(c.hidden_size);
  const auto count = [&](char type) {
    return static_cast<double>(std::count(c.mamba.layers.begin(), c.mamba.layers.end(), type));
  };
  const double n = static_cast<double>(c.num_attention_heads);
  const double g = static_cast<double>(c.num_query_groups);
  const double p = static_cast<double>(c.kv_channels) * n / h;
  const double attention = 4 * B * s * h * p * (h + h * g / n + s / 2);
  const double mlp = 4 * (static_cast<double>(c.ffn_hidden_size) / h) *
                     (c.gated_mlp() ? 1.5 : 1.0) * B * s * h * h;
  const MambaConfig& m = c.mamba;
  const double d_in = static_cast<double>(m.d_inner(c.hidden_size));
  const double in_proj_out = static_cast<double>(m.in_proj_dim(c.hidden_size));
  const double mamba = 2 * B * s * h * in_proj_out +
                       7 * B * s * d_in * static_cast<double>(m.state_dim) + 2 * B * s * d_in * h;
  const double logits = 2 * B * s * h * static_cast<double>(c.padded_vocab_size);
  return 3 * (count('*') * attention + count('-') * mlp + count('M') * mamba + logits);
}

namespace {

ModelSpec make_mamba_spec() {
  ModelSpec s = gpt_spec();
  s.name = "mamba";
  s.entry_point = "pretrain_mamba";
  s.summary = "hybrid Mamba-2 / attention / MLP decoder (Megatron's pretrain_mamba.py)";
  s.flops_per_iteration = hybrid_flops_per_iteration;
  const auto refuse = [] {
    MEGATRON_CHECK(false,
                   "Hugging Face conversion of hybrid Mamba models is not implemented: train from "
                   "scratch or from a megatron checkpoint (--load)");
  };
  s.hf.read_config = [refuse](const std::string&) -> TransformerConfig {
    refuse();
    return {};
  };
  s.hf.load = [refuse](const std::string&, ModelChunk&, ParamSet&) { refuse(); };
  s.hf.save = [refuse](const std::string&, const ModelChunk&, const std::string&,
                       std::optional<DType>) { refuse(); };
  s.hf.check_exportable = [refuse](const TransformerConfig&) { refuse(); };
  return s;
}

}  // namespace

const ModelSpec& mamba_spec() {
  static const ModelSpec spec = make_mamba_spec();
  return spec;
}

}  // namespace megatron
