// GPT's activation bytes per micro-batch and chunk (see gpt_memory.h).
#include "models/gpt/gpt_memory.h"

#include <algorithm>
#include <vector>

namespace megatron {

int64_t activation_bytes_per_microbatch(const TransformerConfig& c, const ActivationShape& a) {
  const int64_t s = c.seq_length / a.cp, b = a.micro_batch_size, h = c.hidden_size, t = a.tp;
  const int64_t np = c.num_attention_heads, ng = c.num_query_groups, hn = c.head_dim();
  const int64_t f = c.ffn_hidden_size, sb = s * b;
  const int64_t s_local_b = a.sequence_parallel && t > 1 ? sb / t : sb;  // s' b
  const int64_t e = 4;                                                   // fp32 activations
  const int64_t g = is_half(c.compute_dtype) ? 2 : 4;                    // saved GEMM inputs
  const int64_t stats = (c.normalization == Normalization::kLayerNorm ? 2 : 1) * s_local_b * e;
  const int64_t core = (sb * np * hn + b * np * s) / t * e;  // attention out + lse
  // An MLP of width `ffn` over `rows` tokens: fc1's output, fc2's input.
  auto mlp = [&](int64_t ffn, int64_t rows) {
    return rows * (c.gated_mlp() ? 2 * ffn : ffn) / t * e + rows * ffn / t * g;
  };
  auto gqa = [&](int64_t groups) {
    return 2 * s_local_b * h * e + 2 * stats      // input, x1, norm statistics
           + sb * h * g                           // qkv GEMM input
           + sb * (np + 2 * groups) * hn / t * e  // qkv after RoPE
           + core
           // linear_proj's input: the attention output itself in fp32 runs, a 16-bit copy
           // otherwise
           + (g == 4 ? 0 : sb * np * hn / t * g)
           // --attention-output-gate: the gates' sigmoid, and in fp32 runs linear_proj's input
           // (the gated output) besides the output itself
           + (c.attention_output_gate ? sb * np * hn / t * e * (g == 4 ? 2 : 1) : 0);
  };
  const int64_t gqa_attention = gqa(ng);
  // Multi-latent attention (transformer/mla.h): the down projections' shared input (this rank's
  // positions), the latents before their norms (f32) and after (the up projections' inputs,
  // gathered under SP), the packed buffer of heads head_dim() wide, the core attention's output,
  // and linear_proj's input (a copy of the value channels when they are narrower, or 16-bit).
  auto mla_attention = [&]() {
    const MlaConfig& m = c.mla;
    const int64_t latents = (m.q_lora_rank + m.kv_lora_rank) * (c.qk_layernorm ? 1 : 0);
    const int64_t proj_copy = m.v_head_dim != hn || g != 4 ? sb * np * m.v_head_dim / t * g : 0;
    return 2 * s_local_b * h * e + 2 * stats + s_local_b * h * g + s_local_b * latents * e +
           (c.qk_layernorm ? 2 * s_local_b * e : 0) + sb * (m.q_lora_rank + m.kv_lora_rank) * g +
           sb * np * 3 * hn / t * e + core + proj_copy;
  };
  const int64_t attention = c.mla.enabled ? mla_attention() : gqa_attention;
  const int64_t layer = attention + sb * h * g + mlp(f, sb);  // + fc1's input
  // An MoE layer: each token's k expert rows (experts' input, activation before and after the
  // probabilities), the router's logits and routing, and the shared experts' MLP. LatentMoE: the
  // rows are L wide, and the two projections keep their inputs (h and L per token). The shared
  // experts' gate keeps their output and its sigmoid (h + 1 per local token, in f32).
  const int64_t k = c.moe.router_topk, fe = c.moe.ffn_hidden_size;
  const int64_t lat = c.moe.latent_size, rows_w = lat > 0 ? lat : h;
  const int64_t moe_layer =
      attention + sb * k / t * (rows_w * g + fe * e) + mlp(fe, sb * k) +
      s_local_b * c.moe.num_experts * 8 * 3 + (lat > 0 ? s_local_b * (h + lat) * g : 0) +
      (c.moe.shared_expert_intermediate_size > 0
           ? sb * h * g + mlp(c.moe.shared_expert_intermediate_size, sb)
           : 0) +
      (c.moe.shared_expert_gate ? s_local_b * (h + 1) * e + (g == 4 ? 0 : s_local_b * h * g) : 0);
  const int64_t input = s_local_b * h * e;  // a recomputed segment's input
  const int64_t L = a.num_layers;
  int64_t bytes = 0;
  // The stage's layers are global layers [first_layer, first_layer + L).
  int64_t kept = 0;  // every layer's activations
  // A hybrid model's layers (transformer/mamba): attention only, MLP only (its input, norm
  // statistics and fc1's input besides the MLP), or Mamba: its input and norm statistics,
  // in_proj's input, the f32 convolution input and output, dt, z, the scan's output, the gated
  // norm's statistics and out_proj's input, and one scan state per 64 positions.
  const int64_t mlp_only = s_local_b * h * e + stats + sb * h * g + mlp(f, sb);
  int64_t mamba_layer = 0;
  if (c.mamba.has_mamba()) {
    const MambaConfig& m = c.mamba;
    const int64_t di = m.d_inner(h) / t, heads = m.heads(h) / t, conv = m.conv_dim(h) / t;
    const int64_t states = (s + 63) / 64 * b * heads * m.head_dim * m.state_dim;
    mamba_layer = s_local_b * h * e + stats + sb * h * g +
                  sb * (2 * conv + heads + 2 * di + m.num_groups / t) * e + sb * di * g +
                  states * e;
  }
  // A heterogeneous model's branches (transformer/heterogeneous_config.h): a whole attention
  // with its groups (its input, norm statistics and what attention keeps), a linear replacement
  // (its input, norm statistics and the GEMM's gathered input), a whole MLP with its width or a
  // linear one (x1, norm statistics, the GEMM input, the MLP's intermediates); no-ops nothing.
  const int64_t branch_input = s_local_b * h * e + stats + sb * h * g;
  auto hetero_layer = [&](int64_t l) {
    const HeterogeneousBlock& hb = *c.heterogeneous.block(l);
    const TransformerConfig lc = c.for_layer(l);
    int64_t n = 0;
    if (hb.attention == BranchKind::kWhole)
      n += gqa(lc.num_query_groups) - s_local_b * h * e - stats;
    if (hb.attention == BranchKind::kLinear) n += branch_input;
    if (hb.mlp == BranchKind::kWhole) n += branch_input + mlp(lc.ffn_hidden_size, sb);
    if (hb.mlp == BranchKind::kLinear) n += branch_input;
    return n;
  };
  std::vector<int64_t> per_layer(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    const int64_t l = a.first_layer + i;
    int64_t& n = per_layer[static_cast<size_t>(i)];
    if (c.heterogeneous.enabled()) {
      n = hetero_layer(l);
    } else {
      switch (c.mamba.layer_type(l)) {
        case 'M':
          n = mamba_layer;
          break;
        case '*':
          n = attention;
          break;
        case '-':
          n = mlp_only;
          break;
        case 'E':  // the MoE layer's own part, after its input and norm statistics
          n = s_local_b * h * e + stats + moe_layer - attention;
          break;
        default:
          n = c.is_moe_layer(l) ? moe_layer : layer;
      }
    }
    kept += n;
  }
  switch (c.recompute_granularity) {
    case RecomputeGranularity::kNone:
      bytes = kept;
      break;
    case RecomputeGranularity::kSelective: {
      // What each module's recomputation drops (--recompute-modules): the core attention's
      // output; a dense MLP's or MoE layer's (or the shared experts') intermediates, their input
      // kept; the experts' activation and its scaled copy; MLA's packed q, k, v.
      const RecomputeModules& r = c.recompute_modules;
      const int64_t shared = c.moe.shared_expert_intermediate_size;
      const int64_t moe_intermediates = moe_layer - attention - s_local_b * h * g;
      bytes = kept;
      for (int64_t i = 0; i < L; ++i) {
        const bool is_moe = c.is_moe_layer(a.first_layer + i);
        // A hybrid model's layers recompute only the branch they have (none in Mamba layers).
        const char kind = c.mamba.layer_type(a.first_layer + i);
        bool attn = kind == '\0' || kind == '*', dense = kind == '\0' || kind == '-';
        int64_t width = f;
        // A heterogeneous layer: only whole branches recompute (a linear replacement keeps its
        // input and has nothing else).
        if (const HeterogeneousBlock* hb = c.heterogeneous.block(a.first_layer + i)) {
          attn = hb->attention == BranchKind::kWhole;
          dense = hb->mlp == BranchKind::kWhole;
          width = c.for_layer(a.first_layer + i).ffn_hidden_size;
        }
        if (attn && r.core_attn) bytes -= core;
        if (attn && r.mla_up_proj && c.mla.enabled) bytes -= sb * np * 3 * hn / t * e;
        if (dense && !is_moe && r.mlp) bytes -= mlp(width, sb);
        // layernorm: the norms' outputs as their consumers kept them (gathered under SP).
        if (attn && r.layernorm) bytes -= c.mla.enabled ? s_local_b * h * g : sb * h * g;
        if (dense && r.layernorm && !is_moe) bytes -= sb * h * g;
        if (is_moe && r.moe) {
          bytes -= moe_intermediates + (r.layernorm ? s_local_b * h * g : 0);
        } else if (is_moe) {
          if (r.moe_act) bytes -= sb * k / t * fe * (e + g);
          if (r.shared_experts && shared > 0) bytes -= mlp(shared, sb);
        }
      }
      break;
    }
    case RecomputeGranularity::kFull: {
      const int64_t n = std::max<int64_t>(c.recompute_num_layers, 1);
      // Uniform: one input per chunk; block: the stage's first n layers keep their input, the
      // others everything (each layer its own kind). --distribute-saved-activations: each kept
      // input is 1/tp of it.
      const bool split = c.distribute_saved_activations && t > 1 && !a.sequence_parallel;
      const int64_t kept_input = split ? input / t : input;
      bytes = (L + n - 1) / n * kept_input;
      if (c.recompute_method != RecomputeMethod::kUniform) {
        bytes = std::min(n, L) * kept_input;
        for (int64_t i = n; i < L; ++i) bytes += per_layer[static_cast<size_t>(i)];
      }
      break;
    }
  }
  if (a.post_process) {
    const int64_t vp_local = c.padded_vocab_size / t;
    // Final norm (input and statistics), output GEMM input, fp32 logits, their lse, targets;
    // each multi-token prediction depth keeps its own (its head's Ctx until backward).
    bytes += (s_local_b * h * e + stats + sb * h * g + sb * vp_local * e + sb * e + sb * 8) *
             (1 + c.mtp_num_layers);
  }
  if (a.pre_process) bytes += 2 * sb * 8;  // token and position ids, i64
  return bytes;
}

}  // namespace megatron
