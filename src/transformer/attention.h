// SelfAttention: packed QKV projection, optional RoPE, causal core attention, output projection.
// The scores are scaled by cfg.attention_scale() (1/sqrt(hn) unless a softmax scale is set) and
// take an additive bias where the layout has one (T5's relative positions, after the scale).
//
// linear_qkv produces Megatron's per-query-group packing: for each of ng groups, qpg query heads
// then one key and one value head, each hn wide ([s, b, ng, qpg + 2, hn]); the core attention
// reads q, k, v from that buffer in place (ops::packed_qkv_view), and writes their gradients
// into one packed dqkv the same way. With GQA (ng < heads) each key/value head serves qpg
// query heads. linear_proj maps the heads' outputs back to the hidden size (scaled init).
//
// Generation (mode.kv_cache, transformer/kv_cache.h): x holds the new positions only; their keys
// and values (after --qk-layernorm and RoPE, at positions offset .. offset + s - 1) join the
// layer's cache, and the queries attend causally over every cached position. Nothing is kept for
// backward.
//
// Selective recomputation (--recompute-granularity selective, Megatron's core_attn): forward
// drops the core attention's output `out` [s, b, np/tp, hn] and log-sum-exp `lse` [b, np/tp, s]
// once linear_proj has consumed them, and backward recomputes both from the saved qkv with the
// saved spec (same kernel, same inputs, same dropout coordinates: the same bits) before using
// them. In f32 runs linear_proj's saved input is `out` itself; it is dropped and re-linked too,
// so the memory really goes (in bf16 runs linear_proj keeps its own bf16 copy of `out`).
//
// Multi-latent attention (--multi-latent-attention, transformer/mla.h): MlaProjections replaces
// linear_qkv and writes the same packed buffer (one query per group, heads cfg.head_dim() wide);
// RoPE then turns the first qk_pos_emb_head_dim channels of every query and key head (YaRN with
// --rope-type yarn) whatever --position-embedding-type says, as Megatron's MLA applies its own, and
// linear_proj takes the first v_head_dim channels of each head's output.
//
// Sliding-window attention (--window-size, --window-attn-skip-freq): the layer's window goes into
// the spec (ops::AttentionSpec::window), so every path (tiles, context-parallel blocks, the KV
// cache) masks the same keys. Attention sinks (--softmax-type off-by-one / learnable): after the
// core attention, (out, lse) take one more logit per head in the softmax's denominator
// (ops::attention_sink_forward; learnable: the parameter core_attention.softmax_offset, one per
// head, split over TP like the heads); the core attention's backward then runs on the merged out
// and lse unchanged, and the sink's gradient comes from ops::attention_sink_backward.
//
// --attention-output-gate (Megatron core 0.19): linear_qkv's rows per query group are the queries,
// one gate per query channel, the key and the value; the gates are split off (the packed qkv
// above is what the core attention reads, as without them) and the attention's output is
// multiplied by sigmoid(gate) before linear_proj, in f32 (Megatron's _apply_output_gate).
//
// --qk-layernorm: q_layernorm and k_layernorm, norms over hn shared by every query (key) head,
// run on the query and key heads between linear_qkv and RoPE (Megatron's
// get_query_key_value_tensors). Each TP rank sees only its heads, so their weight gradients are
// partial sums over TP (marked like sequence-parallel replicas: summed over TP after backward,
// as Megatron's _allreduce_layernorm_grads does for q_layernorm and k_layernorm).
#pragma once

#include <optional>
#include <string>

#include "parallel/row_scale.h"
#include "parallel/tensor_parallel_linear.h"
#include "tensor/ops.h"
#include "transformer/config.h"
#include "transformer/forward_mode.h"
#include "transformer/mla.h"
#include "transformer/norm.h"
#include "transformer/qk_clip.h"
#include "transformer/tensor_parallel_context.h"

namespace megatron {

class SelfAttention {
 public:
  struct Ctx {
    ColumnParallelLinear::Ctx qkv_ctx;
    RowParallelLinear::Ctx proj_ctx;
    Tensor qkv;  // [s, b, ng/tp, qpg + 2, hn], after RoPE
    Tensor out;  // [s, b, np/tp, hn]; undefined between forward and backward when selective
    Tensor lse;  // [b, np/tp, s]; likewise
    bool recompute = false;    // out and lse dropped in forward, recomputed in backward
    bool rebuild_qkv = false;  // qkv dropped in forward (mla_up_proj), rebuilt in backward
    Shape proj_input_shape;  // if linear_proj's saved input was `out` (dropped with it): its shape
    Tensor positions;
    ops::AttentionSpec spec;   // as run in forward: the mask, the dropout RNG coordinates
    Norm::Ctx q_norm, k_norm;  // --qk-layernorm
    MlaProjections::Ctx mla;   // --multi-latent-attention
    Tensor gate_sig;           // --attention-output-gate: sigmoid(gate) [s, b, np/tp, hn]
  };

  SelfAttention(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                const TensorParallelContext& tp);

  // x [s, b, h] -> [s, b, h] ([s/tp, b, h] under sequence parallelism).
  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  // With a score bias (layout.bias, T5's relative positions), dbias (if given) receives its
  // gradient [1, np/tp, s, s].
  Tensor backward(const Tensor& dy, Ctx& ctx, Tensor* dbias = nullptr) const;
  void collect(std::vector<Param*>& out);

  std::optional<ColumnParallelLinear> linear_qkv;  // every attention but multi-latent
  std::optional<MlaProjections> mla;               // --multi-latent-attention
  RowParallelLinear linear_proj;
  std::optional<Norm> q_layernorm, k_layernorm;  // --qk-layernorm (not with MLA: see mla.h)
  std::optional<Param> softmax_offset;           // --softmax-type learnable: [np/tp]
  // What the first GEMMs take the layer's (normed) input in.
  DType gemm_input_dtype() const {
    return mla ? mla->gemm_input_dtype() : linear_qkv->gemm_input_dtype();
  }
  // cfg.track_max_logits (--qk-clip, --log-max-attention-logit): [np/tp] f32 on the
  // activations' device, each local head's largest attention score over the training forwards
  // since the last reset_max_logits() (ops::AttentionSpec::max_logit); undefined before the
  // first. Evaluation and generation forwards leave it alone.
  const Tensor& max_logits() const { return max_logits_; }
  int64_t local_heads() const { return heads_local_; }
  void reset_max_logits() { max_logits_ = Tensor(); }
  // qk-clip (transformer/qk_clip.h): the row factors of this layer's query and key projections
  // for the largest scores `m` of the local heads (rounded to clip.dtype, reduced over data and
  // context parallelism): per query group the max over its heads (Megatron's GQA rule; MLA: per
  // head). Empty when no group exceeded the threshold.
  std::vector<RowScale> qk_clip_scales(const std::vector<float>& m, const QkClip& clip);
  // Every GEMM's FP8 scaling state (cfg.fp8).
  std::vector<Fp8GemmScaling*> enable_fp8();
  // --recompute-modules layernorm: forget the input x where forward kept it (the first GEMMs'
  // saved inputs), and take it back, recomputed, before backward.
  void drop_input(Ctx& ctx) const;
  void keep_input(const Tensor& x, Ctx& ctx) const;

 private:
  // The generation path (see the file comment).
  Tensor forward_cached(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                        const ForwardMode& mode) const;
  // ctx.out, ctx.lse = core attention of ctx.qkv under ctx.spec (forward and recomputation).
  void core_attention(Ctx& ctx) const;
  // The sink logits of this rank's heads in `like`'s dtype and device (--softmax-type), or an
  // undefined tensor (vanilla).
  Tensor sinks(const Tensor& like) const;
  // dout -> the sink's gradient, accumulated into softmax_offset (learnable only).
  void sink_backward(const Tensor& dout, const Ctx& ctx) const;
  // --qk-layernorm on the packed [s, b, ng, qpg + 2, hn] buffer: the query heads through
  // q_layernorm, the key head through k_layernorm, the value head as it is. backward maps the
  // gradient of the result to the gradient of the input the same way.
  // The packed qkv [s, b, ng/tp, qpg + 2, hn] of x (s positions after sequence parallelism's
  // gather), and with --attention-output-gate the gates [s, b, np/tp, hn] in *gate.
  Tensor project_qkv(const Tensor& x, int64_t s, int64_t b, Ctx& ctx, Tensor* gate) const;
  Tensor qk_norm_forward(const Tensor& qkv, Ctx& ctx) const;
  Tensor qk_norm_backward(const Tensor& dqkv, Ctx& ctx) const;

  const TransformerConfig& cfg_;
  int64_t layer_;
  TensorParallelContext tp_;
  int64_t groups_local_, heads_local_;  // query groups and heads on this TP rank
  bool recompute_core_attention_;       // --recompute-granularity selective (core_attn)
  bool recompute_mla_up_ = false;       // --recompute-modules mla_up_proj
  ops::RopeSpec rope_;
  bool rope_on_ = false;       // RoPE (or MLA's own) turns q and k
  mutable Tensor max_logits_;  // see max_logits(): raised by const training forwards
  // The heads' outputs [s, b, np/tp, head_dim] -> linear_proj's input [s, b, np/tp * v_head_dim]
  // (the same tensor unless MLA's value heads are narrower), and back for the gradient.
  Tensor proj_input(const Tensor& out) const;
  Tensor heads_grad(const Tensor& dproj, const Shape& out_shape) const;
};

}  // namespace megatron
