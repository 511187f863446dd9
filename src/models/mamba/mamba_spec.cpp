// Hybrid Mamba spec: GPT's chunks, loss and data with the hybrid layers; Megatron's hybrid FLOPs.
#include "models/mamba/mamba_spec.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "models/gpt/gpt_spec.h"
#include "models/mamba/mamba_hf.h"

namespace megatron {

double hybrid_flops_per_iteration(const TransformerConfig& c, int64_t global_batch_size) {
  const double B = static_cast<double>(global_batch_size), s = static_cast<double>(c.seq_length);
  const double h = static_cast<double>(c.hidden_size);
  // Megatron's get_hybrid_layer_counts: the decoder's layers and every MTP depth's.
  const std::string& mtp = c.mamba.mtp_layers;
  const auto count = [&](char type) {
    return static_cast<double>(std::count(c.mamba.layers.begin(), c.mamba.layers.end(), type) +
                               c.mtp_num_layers * std::count(mtp.begin(), mtp.end(), type));
  };
  const double n = static_cast<double>(c.num_attention_heads);
  const double g = static_cast<double>(c.num_query_groups);
  const double p = static_cast<double>(c.kv_channels) * n / h;
  const double attention = 4 * B * s * h * p * (h + h * g / n + s / 2);
  const double mlp = 4 * (static_cast<double>(c.ffn_hidden_size) / h) *
                     (c.gated_mlp() ? 1.5 : 1.0) * B * s * h * h;
  // Megatron's mamba_layer_flops: d_in is 2 hidden whatever --mamba-num-heads says (the heads
  // enter the in-projection's width only).
  const MambaConfig& m = c.mamba;
  double mamba = 0;
  if (count('M') > 0) {
    const double d_in = 2 * h;
    const double heads = m.num_heads > 0 ? static_cast<double>(m.num_heads)
                                         : std::floor(d_in / static_cast<double>(m.head_dim));
    const double gn = static_cast<double>(m.num_groups * m.state_dim);
    mamba = 2 * B * s * h * (2 * d_in + 2 * gn + heads) +
            7 * B * s * d_in * static_cast<double>(m.state_dim) + 2 * B * s * d_in * h;
  }
  // Megatron core 0.16's moe_layer_flops: the routed experts' and the shared experts' MLPs (no
  // router GEMM).
  const double gated = c.gated_mlp() ? 1.5 : 1.0;
  double moe = 4 * B * s * h * gated *
               (static_cast<double>(c.moe.ffn_hidden_size * c.moe.router_topk) +
                static_cast<double>(c.moe.shared_expert_intermediate_size));
  if (c.moe.latent_size > 0) {
    // Core 0.19's LatentMoE: the routed experts at the latent width L, and its two projections.
    const double L = static_cast<double>(c.moe.latent_size);
    moe = 4 * B * s * L * gated * static_cast<double>(c.moe.ffn_hidden_size * c.moe.router_topk) +
          4 * B * s * h * L +
          4 * B * s * h * gated * static_cast<double>(c.moe.shared_expert_intermediate_size);
  }
  // The output layer runs once for the decoder and once per MTP depth (eh_proj is not counted,
  // as in Megatron).
  const double logits = 2 * B * s * h * static_cast<double>(c.padded_vocab_size) *
                        static_cast<double>(1 + c.mtp_num_layers);
  return 3 * (count('*') * attention + count('-') * mlp + count('M') * mamba + count('E') * moe +
              logits);
}

namespace {

ModelSpec make_mamba_spec() {
  ModelSpec s = gpt_spec();
  s.name = "mamba";
  s.entry_point = "pretrain_mamba";
  // Megatron core 0.19 renamed the script (pretrain_mamba.py is its deprecated wrapper).
  s.entry_point_aliases = {"pretrain_hybrid"};
  s.summary =
      "hybrid Mamba-2 / attention / MLP decoder (Megatron's pretrain_mamba.py, pretrain_hybrid.py)";
  s.flops_per_iteration = hybrid_flops_per_iteration;
  s.hf.read_config = [](const std::string& dir) { return read_nemotron_h_config(dir).config; };
  s.hf.load = [](const std::string& dir, ModelChunk& whole, ParamSet& params) {
    load_nemotron_h_weights(dir, const_cast<GPTModel&>(gpt_model_of(whole)), params);
  };
  s.hf.save = [](const std::string& dir, const ModelChunk& whole, const std::string& source_dir,
                 std::optional<DType> dtype) {
    save_nemotron_h(dir, gpt_model_of(whole), source_dir, dtype);
  };
  s.hf.check_exportable = check_nemotron_h_exportable;
  return s;
}

}  // namespace

const ModelSpec& mamba_spec() {
  static const ModelSpec spec = make_mamba_spec();
  return spec;
}

}  // namespace megatron
