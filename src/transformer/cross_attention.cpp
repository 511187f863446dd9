// Cross-attention: query from the decoder, packed keys and values from the encoder's output.
#include "transformer/cross_attention.h"

#include <cmath>

#include "core/error.h"
#include "parallel/mappings.h"
#include "transformer/kv_cache.h"

namespace megatron {

namespace {

// The key or value heads of a [sk, b, np, 2, hn] buffer packed per head as [k_h | v_h].
ops::AttentionView kv_view(const Tensor& kv, bool value) {
  const int64_t s = kv.dim(0), b = kv.dim(1), np = kv.dim(2), hn = kv.dim(4);
  ops::AttentionView v;
  v.tensor = kv;
  v.offset = value ? hn : 0;
  v.s = s;
  v.b = b;
  v.groups = np;
  v.per_group = 1;
  v.hn = hn;
  v.stride_s = b * np * 2 * hn;
  v.stride_b = np * 2 * hn;
  v.stride_g = 2 * hn;
  v.stride_p = hn;
  return v;
}

}  // namespace

CrossAttention::CrossAttention(const std::string& name, const TransformerConfig& cfg,
                               int64_t stream_layer, const TensorParallelContext& tp)
    : linear_q(name + ".linear_q", cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim(),
               cfg.init_method_std, *tp.group,
               {.with_bias = cfg.add_bias_linear, .sequence_parallel = tp.sp()}),
      linear_kv(name + ".linear_kv", cfg.hidden_size, 2 * cfg.num_attention_heads * cfg.head_dim(),
                cfg.init_method_std, *tp.group,
                {.with_bias = cfg.add_bias_linear, .sequence_parallel = tp.sp()}),
      linear_proj(name + ".linear_proj", cfg.num_attention_heads * cfg.head_dim(), cfg.hidden_size,
                  cfg.output_init_std(), *tp.group,
                  {.with_bias = cfg.add_bias_linear,
                   .input_is_parallel = true,
                   .sequence_parallel = tp.sp()}),
      cfg_(cfg),
      stream_layer_(stream_layer),
      tp_(tp),
      heads_local_(divide(cfg.num_attention_heads, tp.size(),
                          "--num-attention-heads by --tensor-model-parallel-size")) {
  MEGATRON_CHECK(cfg.num_query_groups == cfg.num_attention_heads,
                 "cross-attention has no grouped-query form (as in Megatron): drop "
                 "--num-query-groups / --group-query-attention for encoder-decoder models");
}

void CrossAttention::collect(std::vector<Param*>& out) {
  linear_q.collect(out);
  linear_kv.collect(out);
  linear_proj.collect(out);
}

Tensor CrossAttention::forward(const Tensor& x, const Tensor& memory, const Tensor& memory_valid,
                               Ctx& ctx, const ForwardMode& mode) const {
  const int64_t f = tp_.sp() ? tp_.size() : 1;
  const int64_t sq = x.dim(0) * f, sk = memory.dim(0) * f, b = x.dim(1);
  MEGATRON_CHECK(memory.ndim() == 3 && memory.dim(1) == b && memory.dim(2) == cfg_.hidden_size,
                 "CrossAttention: the encoder output must be [sk, ", b, ", ", cfg_.hidden_size,
                 "], got ", memory.str());
  const int64_t np = heads_local_, hn = cfg_.head_dim();
  ctx.q = linear_q.forward(x, ctx.q_ctx).view({sq, b, np, hn});
  if (mode.kv_cache) {  // generation: the memory's keys and values once per generation
    Tensor& kv = mode.kv_cache->cross_kv(stream_layer_);
    if (!kv.defined()) kv = linear_kv.forward(memory, ctx.kv_ctx).view({sk, b, np, 2, hn});
    ctx.kv = kv;
  } else {
    ctx.kv = linear_kv.forward(memory, ctx.kv_ctx).view({sk, b, np, 2, hn});
  }
  ctx.spec.scale = static_cast<float>(cfg_.attention_scale());
  ctx.spec.causal = false;
  ctx.spec.precision = cfg_.compute_dtype;
  if (memory_valid.defined()) {
    check_shape(memory_valid, {b, sk}, "cross-attention memory_valid");
    ctx.spec.key_valid = memory_valid;
  }
  ctx.spec.dropout = mode.training ? static_cast<float>(cfg_.attention_dropout) : 0.0f;
  ctx.spec.seed = mode.seed;
  ctx.spec.stream = mode.site_stream(stream_layer_, 4);
  ctx.spec.head_offset = tp_.rank() * np;
  ctx.spec.total_heads = cfg_.num_attention_heads;
  ctx.out = Tensor::empty({sq, b, np, hn}, ctx.q.dtype(), ctx.q.device());
  ctx.lse = Tensor::empty({b, np, sq}, ctx.q.dtype(), ctx.q.device());
  ops::attention_forward(ctx.out, ctx.lse, ops::attention_view(ctx.q, np), kv_view(ctx.kv, false),
                         kv_view(ctx.kv, true), ctx.spec);
  Tensor y = linear_proj.forward(ctx.out.view({sq, b, np * hn}), ctx.proj_ctx);
  if (mode.kv_cache) ctx = Ctx{};  // nothing is kept for a backward in generation
  return y;
}

Tensor CrossAttention::backward(const Tensor& dy, Ctx& ctx, Tensor* d_memory) const {
  const int64_t sq = ctx.q.dim(0), sk = ctx.kv.dim(0), b = ctx.q.dim(1);
  const int64_t np = heads_local_;
  Tensor dout = linear_proj.backward(dy, ctx.proj_ctx).view(ctx.out.shape());
  Tensor dq = Tensor::empty(ctx.q.shape(), ctx.q.dtype(), ctx.q.device());
  Tensor dkv = Tensor::empty(ctx.kv.shape(), ctx.kv.dtype(), ctx.kv.device());
  ops::attention_backward(ops::attention_view(dq, np), kv_view(dkv, false), kv_view(dkv, true),
                          Tensor(), dout, ops::attention_view(ctx.q, np), kv_view(ctx.kv, false),
                          kv_view(ctx.kv, true), ctx.out, ctx.lse, ctx.spec);
  Tensor dx = linear_q.backward(dq.view({sq, b, dq.numel() / (sq * b)}), ctx.q_ctx);
  *d_memory = linear_kv.backward(dkv.view({sk, b, dkv.numel() / (sk * b)}), ctx.kv_ctx);
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
