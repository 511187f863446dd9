// Self-attention layer: packed QKV GEMM, RoPE in place on q and k, core attention straight from
// the packed buffer, output projection; backward undoes RoPE on the gradients.
#include "transformer/attention.h"

#include <cmath>
#include <limits>
#include <utility>

#include "parallel/mappings.h"
#include "tensor/ops.h"
#include "transformer/kv_cache.h"

namespace megatron {

namespace {
int64_t qkv_width(const TransformerConfig& c) {
  const int64_t gates = c.attention_output_gate ? c.num_attention_heads : 0;
  return (c.num_attention_heads + gates + 2 * c.num_query_groups) * c.head_dim();
}
}  // namespace

SelfAttention::SelfAttention(const std::string& name, const TransformerConfig& cfg,
                             int64_t layer_number, const TensorParallelContext& tp)
    :  // Megatron's scaled_init_method_normal for output projections (TransformerConfig).
      linear_proj(name + ".linear_proj", cfg.num_attention_heads * cfg.v_head_dim(),
                  cfg.hidden_size, cfg.output_init_std(), *tp.group,
                  {.with_bias = cfg.add_bias_linear,
                   .input_is_parallel = true,
                   .sequence_parallel = tp.sp()}),
      cfg_(cfg),
      layer_(layer_number),
      tp_(tp),
      groups_local_(divide(cfg.num_query_groups, tp.size(),
                           "--num-query-groups by --tensor-model-parallel-size")),
      heads_local_(divide(cfg.num_attention_heads, tp.size(),
                          "--num-attention-heads by --tensor-model-parallel-size")),
      recompute_core_attention_(cfg.recomputes(&RecomputeModules::core_attn)) {
  tp_.cp = tp.cp.for_layer(layer_number);  // per-layer --cp-comm-type
  if (cfg.mla.enabled) {
    mla.emplace(name, cfg, tp);
    recompute_mla_up_ = cfg.recomputes(&RecomputeModules::mla_up_proj);
    const MlaConfig& m = cfg.mla;
    rope_on_ = true;
    rope_.head_begin = 0;
    rope_.head_end = 2;  // the query and the key; never the value
    // Megatron's RotaryEmbedding over the rotary channels takes --rotary-percent; its YaRN all.
    rope_.rot_dim = m.yarn ? m.qk_pos_emb_head_dim
                           : static_cast<int64_t>(static_cast<double>(m.qk_pos_emb_head_dim) *
                                                  cfg.rotary_percent) /
                                 2 * 2;
    rope_.base = static_cast<float>(cfg.rotary_base);
    rope_.interleaved = true;  // pairs (2j, 2j + 1): see the file comment
    if (m.yarn) {
      rope_.yarn_factor = m.rotary_scaling_factor;
      rope_.yarn_original_max_positions = m.original_max_position_embeddings;
      rope_.yarn_beta_fast = m.beta_fast;
      rope_.yarn_beta_slow = m.beta_slow;
      rope_.mscale = m.rope_mscale();
    }
    return;
  }
  linear_qkv.emplace(
      name + ".linear_qkv", cfg.hidden_size, qkv_width(cfg), cfg.init_method_std, *tp.group,
      ColumnParallelLinear::Options{.with_bias = cfg.qkv_bias(), .sequence_parallel = tp.sp()});
  // Muon orthogonalises the queries, keys and values apart (Megatron's qkv_split_shapes; the
  // gates as a block of their own).
  const int64_t per_group = cfg.num_attention_heads / cfg.num_query_groups * cfg.head_dim();
  linear_qkv->weight().qkv_split = {per_group, cfg.head_dim(), cfg.head_dim()};
  if (cfg.attention_output_gate)
    linear_qkv->weight().qkv_split = {per_group, per_group, cfg.head_dim(), cfg.head_dim()};
  if (cfg.qk_l2_norm) {  // Megatron's L2Norm: RMS normalisation without a weight
    q_layernorm.emplace(name + ".q_layernorm", cfg.head_dim(), Normalization::kRMSNorm,
                        cfg.norm_epsilon, false, /*learnable=*/false);
    k_layernorm.emplace(name + ".k_layernorm", cfg.head_dim(), Normalization::kRMSNorm,
                        cfg.norm_epsilon, false, /*learnable=*/false);
  } else if (cfg.qk_layernorm) {
    q_layernorm.emplace(name + ".q_layernorm", cfg.head_dim(), cfg.normalization, cfg.norm_epsilon,
                        cfg.layernorm_zero_centered_gamma);
    k_layernorm.emplace(name + ".k_layernorm", cfg.head_dim(), cfg.normalization, cfg.norm_epsilon,
                        cfg.layernorm_zero_centered_gamma);
    q_layernorm->mark_sequence_parallel(true);  // partial over TP: see the header
    k_layernorm->mark_sequence_parallel(true);
  }
  if (cfg.softmax_type == SoftmaxType::kLearnable) {
    // Megatron's DotProductAttention: a parameter of the local heads, drawn with init_method;
    // 1-D, so no weight decay.
    Param& p = softmax_offset.emplace();
    p.name = name + ".core_attention.softmax_offset";
    p.shape = Shape{heads_local_};
    p.init = Init::kNormal;
    p.init_std = cfg.init_method_std;
    p.no_weight_decay = true;
    p.tp_partition_dim = 0;
    p.tp_rank = tp.rank();
    p.tp_size = tp.size();
  }
  // --no-rope-freq: Megatron drops the rotary embedding of this layer's attention (NoPE).
  const bool rotary = cfg.position_embedding == PositionEmbedding::kRope ||
                      cfg.position_embedding == PositionEmbedding::kYarn;
  if (rotary && !cfg.skips_rope(layer_number)) {
    rope_on_ = true;
    rope_.head_begin = 0;
    rope_.head_end = cfg.queries_per_group() + 1;  // queries and the key; never the value
    rope_.rot_dim = static_cast<int64_t>(static_cast<double>(cfg.head_dim()) * cfg.rotary_percent);
    rope_.base = static_cast<float>(cfg.rotary_base);
    rope_.interleaved = cfg.rotary_interleaved;
    rope_.scaling_factor = cfg.rope_scaling_factor;
    if (cfg.rotary_seq_len_interpolation_factor > 0) {
      rope_.position_scale = 1.0 / cfg.rotary_seq_len_interpolation_factor;
    }
    if (cfg.position_embedding == PositionEmbedding::kYarn) {
      // Core 0.19's YarnRotaryEmbedding: the whole head turns (its dim is kv_channels), and
      // neither Llama 3.1's scaling nor position interpolation applies.
      rope_.rot_dim = cfg.head_dim();
      rope_.scaling_factor = 0;
      rope_.position_scale = 1.0;
      rope_.yarn_factor = cfg.yarn_factor;
      rope_.yarn_original_max_positions = cfg.yarn_original_max_positions;
      rope_.yarn_beta_fast = cfg.yarn_beta_fast;
      rope_.yarn_beta_slow = cfg.yarn_beta_slow;
      rope_.yarn_round_to_int = cfg.yarn_round_to_int;
      rope_.mscale = MlaConfig::yarn_mscale(cfg.yarn_factor, cfg.yarn_mscale) /
                     MlaConfig::yarn_mscale(cfg.yarn_factor, cfg.yarn_mscale_all_dim);
    }
  }
}

void SelfAttention::collect(std::vector<Param*>& out) {
  if (mla) mla->collect(out);
  if (linear_qkv) linear_qkv->collect(out);
  if (q_layernorm) q_layernorm->collect(out);
  if (k_layernorm) k_layernorm->collect(out);
  if (softmax_offset) out.push_back(&*softmax_offset);
  linear_proj.collect(out);
}

std::vector<Fp8GemmScaling*> SelfAttention::enable_fp8() {
  std::vector<Fp8GemmScaling*> out;
  if (mla) out = mla->enable_fp8(cfg_.fp8);
  if (linear_qkv) out.push_back(linear_qkv->enable_fp8(cfg_.fp8));
  out.push_back(linear_proj.enable_fp8(cfg_.fp8));
  return out;
}

void SelfAttention::drop_input(Ctx& ctx) const {
  if (mla) {
    mla->drop_input(ctx.mla);
  } else {
    ctx.qkv_ctx.linear.x = Tensor();
  }
}

void SelfAttention::keep_input(const Tensor& x, Ctx& ctx) const {
  if (mla) {
    mla->keep_input(x, ctx.mla);
  } else {
    linear_qkv->keep_input(x, ctx.qkv_ctx);
  }
}

Tensor SelfAttention::proj_input(const Tensor& out) const {
  const int64_t s = out.dim(0), b = out.dim(1), np = out.dim(2), hn = out.dim(3);
  const int64_t dv = cfg_.v_head_dim();
  if (dv == hn) return out.view({s, b, np * hn});
  Tensor x = Tensor::empty({s * b * np, dv}, out.dtype(), out.device());
  ops::slice_last_dim(x, out.view({s * b * np, hn}), 0);
  return x.view({s, b, np * dv});
}

Tensor SelfAttention::heads_grad(const Tensor& dproj, const Shape& out_shape) const {
  const int64_t rows = out_shape[0] * out_shape[1] * out_shape[2], hn = out_shape[3];
  const int64_t dv = cfg_.v_head_dim();
  if (dv == hn) return dproj.view(out_shape);
  Tensor d = Tensor::empty(out_shape, dproj.dtype(), dproj.device());
  Tensor flat = d.view({rows, hn});
  ops::concat_last_dim(flat, {dproj.view({rows, dv}),
                              Tensor::zeros({rows, hn - dv}, dproj.dtype(), dproj.device())});
  return d;
}

namespace {

// The packed [s, b, ng, qpg + 2, hn] buffer as rows [s b ng, (qpg + 2) hn]: columns [0, qpg hn)
// are the queries, then the key, then the value. split copies the three parts out (queries as
// [rows qpg, hn]); join writes them back into a buffer shaped like `like`.
struct QkvParts {
  Tensor q, k, v;
};

QkvParts split_qkv(const Tensor& packed, int64_t qpg, int64_t hn) {
  const int64_t rows = packed.numel() / ((qpg + 2) * hn);
  const Tensor flat = packed.view({rows, (qpg + 2) * hn});
  QkvParts p{Tensor::empty({rows, qpg * hn}, packed.dtype(), packed.device()),
             Tensor::empty({rows, hn}, packed.dtype(), packed.device()),
             Tensor::empty({rows, hn}, packed.dtype(), packed.device())};
  ops::slice_last_dim(p.q, flat, 0);
  ops::slice_last_dim(p.k, flat, qpg * hn);
  ops::slice_last_dim(p.v, flat, (qpg + 1) * hn);
  p.q = p.q.view({rows * qpg, hn});
  return p;
}

Tensor join_qkv(const QkvParts& p, const Tensor& like, int64_t qpg, int64_t hn) {
  const int64_t rows = like.numel() / ((qpg + 2) * hn);
  Tensor out = Tensor::empty(like.shape(), like.dtype(), like.device());
  Tensor flat = out.view({rows, (qpg + 2) * hn});
  ops::concat_last_dim(flat, {p.q.view({rows, qpg * hn}), p.k, p.v});
  return out;
}

}  // namespace

namespace {

// --attention-output-gate: linear_qkv's output, rows [s b ng, (2 qpg + 2) hn] (per group its
// queries, their gates, the key, the value), split into the packed qkv [s, b, ng, qpg + 2, hn]
// and the gates [s, b, ng qpg, hn] (heads in the packed order, as the attention's output);
// join_gate is the backward's inverse.
std::pair<Tensor, Tensor> split_gate(const Tensor& raw, int64_t s, int64_t b, int64_t ng,
                                     int64_t qpg, int64_t hn) {
  const int64_t rows = s * b * ng;
  const Tensor flat = raw.view({rows, (2 * qpg + 2) * hn});
  Tensor q = Tensor::empty({rows, qpg * hn}, raw.dtype(), raw.device());
  Tensor gate = Tensor::empty({rows, qpg * hn}, raw.dtype(), raw.device());
  Tensor kv = Tensor::empty({rows, 2 * hn}, raw.dtype(), raw.device());
  ops::slice_last_dim(q, flat, 0);
  ops::slice_last_dim(gate, flat, qpg * hn);
  ops::slice_last_dim(kv, flat, 2 * qpg * hn);
  Tensor qkv = Tensor::empty({s, b, ng, qpg + 2, hn}, raw.dtype(), raw.device());
  Tensor qkv_rows = qkv.view({rows, (qpg + 2) * hn});
  ops::concat_last_dim(qkv_rows, {q, kv});
  return {qkv, gate.view({s, b, ng * qpg, hn})};
}

Tensor join_gate(const Tensor& dqkv, const Tensor& dgate, int64_t qpg, int64_t hn) {
  const int64_t rows = dqkv.numel() / ((qpg + 2) * hn);
  const Tensor flat = dqkv.view({rows, (qpg + 2) * hn});
  Tensor dq = Tensor::empty({rows, qpg * hn}, dqkv.dtype(), dqkv.device());
  Tensor dkv = Tensor::empty({rows, 2 * hn}, dqkv.dtype(), dqkv.device());
  ops::slice_last_dim(dq, flat, 0);
  ops::slice_last_dim(dkv, flat, qpg * hn);
  Tensor out = Tensor::empty({rows, (2 * qpg + 2) * hn}, dqkv.dtype(), dqkv.device());
  const Tensor g = dgate.dtype() == dqkv.dtype() ? dgate : dgate.to(dqkv.dtype());
  ops::concat_last_dim(out, {dq, g.view({rows, qpg * hn}), dkv});
  return out;
}

// y = out sigmoid(gate) elementwise (sig keeps the sigmoid for backward), and its backward:
// dout = dy sig, dgate = dy out sig (1 - sig). f32 or f64, as the attention's output.
template <typename T>
void gate_forward(const T* out, const T* gate, int64_t n, T* sig, T* y) {
  for (int64_t i = 0; i < n; ++i) {
    sig[i] = T(1) / (T(1) + std::exp(-gate[i]));
    y[i] = out[i] * sig[i];
  }
}
template <typename T>
void gate_backward(const T* dy, const T* out, const T* sig, int64_t n, T* dout, T* dgate) {
  for (int64_t i = 0; i < n; ++i) {
    dout[i] = dy[i] * sig[i];
    dgate[i] = dy[i] * out[i] * sig[i] * (T(1) - sig[i]);
  }
}

Tensor apply_gate(const Tensor& out, const Tensor& gate, Tensor* sig_out) {
  const Tensor g = gate.dtype() == out.dtype() ? gate : gate.to(out.dtype());
  MEGATRON_CHECK(out.device() == Device::kCPU,
                 "--attention-output-gate runs on the CPU only (drop --device cuda)");
  Tensor sig = Tensor::empty(out.shape(), out.dtype(), out.device());
  Tensor y = Tensor::empty(out.shape(), out.dtype(), out.device());
  if (out.dtype() == DType::kF64) {
    gate_forward(out.data<double>(), g.data<double>(), out.numel(), sig.data<double>(),
                 y.data<double>());
  } else {
    MEGATRON_CHECK(out.dtype() == DType::kF32, "--attention-output-gate runs in f32 or f64");
    gate_forward(out.data<float>(), g.data<float>(), out.numel(), sig.data<float>(),
                 y.data<float>());
  }
  if (sig_out) *sig_out = sig;
  return y;
}

}  // namespace

Tensor SelfAttention::project_qkv(const Tensor& x, int64_t s, int64_t b, Ctx& ctx,
                                  Tensor* gate) const {
  const int64_t ng = groups_local_, qpg = cfg_.queries_per_group(), hn = cfg_.head_dim();
  if (cfg_.attention_output_gate) {
    auto [qkv, g] = split_gate(linear_qkv->forward(x, ctx.qkv_ctx), s, b, ng, qpg, hn);
    *gate = g;
    return qkv;
  }
  return (mla ? mla->forward(x, ctx.mla) : linear_qkv->forward(x, ctx.qkv_ctx))
      .view({s, b, ng, qpg + 2, hn});
}

Tensor SelfAttention::qk_norm_forward(const Tensor& qkv, Ctx& ctx) const {
  const int64_t qpg = cfg_.queries_per_group(), hn = cfg_.head_dim();
  QkvParts p = split_qkv(qkv, qpg, hn);
  p.q = q_layernorm->forward(p.q, ctx.q_norm);
  p.k = k_layernorm->forward(p.k, ctx.k_norm);
  return join_qkv(p, qkv, qpg, hn);
}

Tensor SelfAttention::qk_norm_backward(const Tensor& dqkv, Ctx& ctx) const {
  const int64_t qpg = cfg_.queries_per_group(), hn = cfg_.head_dim();
  QkvParts p = split_qkv(dqkv, qpg, hn);
  p.q = q_layernorm->backward(p.q, ctx.q_norm);
  p.k = k_layernorm->backward(p.k, ctx.k_norm);
  return join_qkv(p, dqkv, qpg, hn);
}

Tensor SelfAttention::sinks(const Tensor& like) const {
  switch (cfg_.softmax_type) {
    case SoftmaxType::kVanilla:
      return Tensor();
    case SoftmaxType::kOffByOne:  // exp(0) = 1 in every row's denominator
      return Tensor::zeros({heads_local_}, like.dtype(), like.device());
    case SoftmaxType::kLearnable:
      return softmax_offset->value_as(like.dtype());
  }
  return Tensor();
}

void SelfAttention::sink_backward(const Tensor& dout, const Ctx& ctx) const {
  if (!softmax_offset || !softmax_offset->main_grad.defined()) return;  // off-by-one, or frozen
  Tensor dsink = Tensor::empty({heads_local_}, ctx.out.dtype(), ctx.out.device());
  ops::attention_sink_backward(dsink, dout, ctx.out, ctx.lse, sinks(ctx.out));
  // Gradients accumulate through const modules, as every weight gradient does (Param::main_grad
  // views the ParamSet's buffer, zeroed each step; no GEMM writes this one, so adding is right
  // from the first micro-batch on).
  Tensor& g = const_cast<Tensor&>(softmax_offset->main_grad);
  ops::add_inplace(g, dsink.dtype() == g.dtype() ? dsink : dsink.to(g.dtype()));
}

void SelfAttention::core_attention(Ctx& ctx) const {
  const int64_t s = ctx.qkv.dim(0), b = ctx.qkv.dim(1), np = heads_local_, hn = cfg_.head_dim();
  ctx.out = Tensor::empty({s, b, np, hn}, ctx.qkv.dtype(), ctx.qkv.device());
  ctx.lse = Tensor::empty({b, np, s}, ctx.qkv.dtype(), ctx.qkv.device());
  if (tp_.cp.enabled()) {  // the local queries over the whole sequence's keys
    cp_attention_forward(ctx.out, ctx.lse, ctx.qkv, ctx.spec, tp_.cp);
  } else {
    ops::attention_forward(ctx.out, ctx.lse, ops::packed_qkv_view(ctx.qkv, ops::QkvPart::kQuery),
                           ops::packed_qkv_view(ctx.qkv, ops::QkvPart::kKey),
                           ops::packed_qkv_view(ctx.qkv, ops::QkvPart::kValue), ctx.spec);
  }
  const Tensor sink = sinks(ctx.out);
  if (sink.defined()) ops::attention_sink_forward(ctx.out, ctx.lse, sink);
}

Tensor SelfAttention::forward_cached(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                                     const ForwardMode& mode) const {
  MEGATRON_CHECK(!tp_.sp() && !tp_.cp.enabled(),
                 "SelfAttention: generation runs without sequence or context parallelism");
  KvCache& cache = *mode.kv_cache;
  const int64_t s = x.dim(0), b = x.dim(1), offset = cache.offset();
  const int64_t ng = groups_local_, qpg = cfg_.queries_per_group(), hn = cfg_.head_dim();
  const int64_t np = heads_local_;
  Tensor gate;
  Tensor qkv = project_qkv(x, s, b, ctx, &gate);
  if (q_layernorm) qkv = qk_norm_forward(qkv, ctx);
  if (rope_on_) {
    Tensor positions = layout.positions;
    if (!positions.defined()) {  // the new positions follow the cached ones
      positions = Tensor::empty({s, b}, DType::kI64);
      int64_t* d = positions.data<int64_t>();
      for (int64_t t = 0; t < s; ++t)
        for (int64_t i = 0; i < b; ++i) d[t * b + i] = offset + t;
      positions = on_device(positions, x.device());  // built on the host, used where x is
    }
    ops::rope_inplace(qkv, positions, rope_, false);
  }
  KvCache::Entry& kv = cache.layer(layer_, s, b, ng, hn, qkv.dtype());
  const Tensor flat = qkv.view({s * b * ng, (qpg + 2) * hn});
  Tensor k_new = kv.k.slice0(offset, offset + s).view({s * b * ng, hn});
  Tensor v_new = kv.v.slice0(offset, offset + s).view({s * b * ng, hn});
  ops::slice_last_dim(k_new, flat, qpg * hn);
  ops::slice_last_dim(v_new, flat, (qpg + 1) * hn);
  ops::AttentionSpec spec;
  spec.scale = static_cast<float>(cfg_.attention_scale());
  spec.causal = true;
  spec.q_offset = offset;  // query t sees cached keys [0, offset + t]
  spec.window = cfg_.attention_window(layer_);
  spec.precision = cfg_.compute_dtype;
  if (layout.bias.defined()) {  // T5's relative positions of the new queries over every key
    check_shape(layout.bias, {1, np, s, offset + s}, "cached attention bias");
    spec.bias = layout.bias.dtype() == qkv.dtype() ? layout.bias : layout.bias.to(qkv.dtype());
  }
  Tensor out = Tensor::empty({s, b, np, hn}, qkv.dtype(), qkv.device());
  Tensor lse = Tensor::empty({b, np, s}, qkv.dtype(), qkv.device());
  ops::attention_forward(out, lse, ops::packed_qkv_view(qkv, ops::QkvPart::kQuery),
                         ops::attention_view(kv.k.slice0(0, offset + s), ng),
                         ops::attention_view(kv.v.slice0(0, offset + s), ng), spec);
  const Tensor sink = sinks(out);
  if (sink.defined()) ops::attention_sink_forward(out, lse, sink);
  if (gate.defined()) out = apply_gate(out, gate, nullptr);
  Tensor y = linear_proj.forward(proj_input(out), ctx.proj_ctx);
  ctx = Ctx{};
  return y;
}

Tensor SelfAttention::forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                              const ForwardMode& mode) const {
  if (mode.kv_cache) return forward_cached(x, layout, ctx, mode);
  const Tensor& positions = layout.positions;
  MEGATRON_CHECK(!tp_.cp.enabled() || positions.defined() || !rope_on_,
                 "SelfAttention: under context parallelism RoPE needs the global positions");
  // Under sequence parallelism x holds s/tp positions; linear_qkv gathers all s of them.
  const int64_t s = x.dim(0) * (tp_.sp() ? tp_.size() : 1), b = x.dim(1);
  const int64_t np = heads_local_;
  Tensor gate;
  Tensor qkv = project_qkv(x, s, b, ctx, &gate);
  if (q_layernorm) qkv = qk_norm_forward(qkv, ctx);
  if (rope_on_) ops::rope_inplace(qkv, positions, rope_, false);
  ctx.positions = positions;
  ctx.spec.scale = static_cast<float>(cfg_.attention_scale());
  if (layout.bias.defined()) {
    MEGATRON_CHECK(!tp_.cp.enabled(), "SelfAttention: a score bias has no context-parallel form");
    check_shape(layout.bias, {1, np, s, s}, "attention bias");
    ctx.spec.bias = layout.bias.dtype() == qkv.dtype() ? layout.bias : layout.bias.to(qkv.dtype());
  }
  MEGATRON_CHECK(layout.causal || !tp_.cp.enabled(),
                 "SelfAttention: context parallelism runs causal attention only; bidirectional "
                 "models (BERT) need --context-parallel-size 1");
  ctx.spec.causal = layout.causal;
  ctx.spec.window = cfg_.attention_window(layer_);
  ctx.spec.precision = cfg_.compute_dtype;
  if (layout.key_valid.defined()) {
    check_shape(layout.key_valid, {b, s}, "attention key_valid");
    ctx.spec.key_valid = layout.key_valid;
  }
  ctx.spec.dropout = mode.training ? static_cast<float>(cfg_.attention_dropout) : 0.0f;
  ctx.spec.seed = mode.seed;
  ctx.spec.stream = mode.site_stream(layer_, 0);
  ctx.spec.head_offset = tp_.rank() * np;
  ctx.spec.total_heads = cfg_.num_attention_heads;
  if (layout.doc_start.defined()) {
    check_shape(layout.doc_start, {b, s}, "attention doc_start");
    ctx.spec.doc_start = layout.doc_start;
  }
  if (mode.training && cfg_.track_max_logits) {
    // Raised by this forward (and again, with the same scores, by a recomputation).
    if (!max_logits_.defined()) {
      max_logits_ =
          Tensor::full({np}, -std::numeric_limits<double>::infinity(), DType::kF32, qkv.device());
    }
    ctx.spec.max_logit = max_logits_;
  }
  ctx.qkv = qkv;
  core_attention(ctx);
  // The gate's product is linear_proj's input (never `out` itself, which selective
  // recomputation then drops alone and rebuilds for the gate's backward).
  Tensor y = linear_proj.forward(
      gate.defined() ? proj_input(apply_gate(ctx.out, gate, &ctx.gate_sig)) : proj_input(ctx.out),
      ctx.proj_ctx);
  if (recompute_core_attention_) {
    ctx.recompute = true;
    Tensor& proj_input = ctx.proj_ctx.linear.x;
    if (proj_input.raw() == ctx.out.raw()) {
      ctx.proj_input_shape = proj_input.shape();
      proj_input = Tensor();
    }
    ctx.out = Tensor();
    ctx.lse = Tensor();
  }
  if (recompute_mla_up_ && mode.training) {
    // Megatron's mla_up_proj: the up-projected, rotated q, k, v go; the latents stay.
    ctx.qkv = Tensor();
    ctx.rebuild_qkv = true;
    mla->drop_up(ctx.mla);
  }
  return y;
}

Tensor SelfAttention::backward(const Tensor& dy, Ctx& ctx, Tensor* dbias) const {
  if (ctx.rebuild_qkv) {  // mla_up_proj's recomputation, before anything reads qkv
    ctx.qkv = mla->up(ctx.mla);
    ops::rope_inplace(ctx.qkv, ctx.positions, rope_, false);
  }
  const int64_t s = ctx.qkv.dim(0), b = ctx.qkv.dim(1);
  if (ctx.recompute) {
    core_attention(ctx);
    if (ctx.proj_input_shape.ndim() > 0) ctx.proj_ctx.linear.x = ctx.out.view(ctx.proj_input_shape);
  }
  Tensor dout = heads_grad(linear_proj.backward(dy, ctx.proj_ctx), ctx.out.shape());
  Tensor dgate;
  if (ctx.gate_sig.defined()) {
    const Tensor dgated = dout.dtype() == ctx.out.dtype() ? dout : dout.to(ctx.out.dtype());
    dout = Tensor::empty(ctx.out.shape(), ctx.out.dtype(), ctx.out.device());
    dgate = Tensor::empty(ctx.out.shape(), ctx.out.dtype(), ctx.out.device());
    if (ctx.out.dtype() == DType::kF64) {
      gate_backward(dgated.data<double>(), ctx.out.data<double>(), ctx.gate_sig.data<double>(),
                    ctx.out.numel(), dout.data<double>(), dgate.data<double>());
    } else {
      gate_backward(dgated.data<float>(), ctx.out.data<float>(), ctx.gate_sig.data<float>(),
                    ctx.out.numel(), dout.data<float>(), dgate.data<float>());
    }
  }
  sink_backward(dout, ctx);
  Tensor dqkv = Tensor::empty(ctx.qkv.shape(), ctx.qkv.dtype(), ctx.qkv.device());
  using ops::packed_qkv_view, ops::QkvPart;
  if (tp_.cp.enabled()) {
    cp_attention_backward(dqkv, dout, ctx.qkv, ctx.out, ctx.lse, ctx.spec, tp_.cp);
  } else {
    Tensor db;
    if (ctx.spec.bias.defined() && dbias)
      db = Tensor::empty(ctx.spec.bias.shape(), ctx.spec.bias.dtype(), ctx.spec.bias.device());
    ops::attention_backward(
        packed_qkv_view(dqkv, QkvPart::kQuery), packed_qkv_view(dqkv, QkvPart::kKey),
        packed_qkv_view(dqkv, QkvPart::kValue), db, dout, packed_qkv_view(ctx.qkv, QkvPart::kQuery),
        packed_qkv_view(ctx.qkv, QkvPart::kKey), packed_qkv_view(ctx.qkv, QkvPart::kValue), ctx.out,
        ctx.lse, ctx.spec);
    if (db.defined()) *dbias = db;
  }
  if (rope_on_) ops::rope_inplace(dqkv, ctx.positions, rope_, true);
  if (q_layernorm) dqkv = qk_norm_backward(dqkv, ctx);
  if (dgate.defined()) dqkv = join_gate(dqkv, dgate, cfg_.queries_per_group(), cfg_.head_dim());
  Tensor dx = mla ? mla->backward(dqkv, ctx.mla)
                  : linear_qkv->backward(dqkv.view({s, b, dqkv.numel() / (s * b)}), ctx.qkv_ctx);
  ctx = Ctx{};
  return dx;
}

std::vector<RowScale> SelfAttention::qk_clip_scales(const std::vector<float>& m,
                                                    const QkClip& clip) {
  MEGATRON_CHECK(static_cast<int64_t>(m.size()) == heads_local_, "qk-clip: ", m.size(),
                 " largest scores for ", heads_local_, " heads");
  // Per clipped unit (query group; MLA: head) its eta, or nothing when none exceeds the bound.
  const int64_t units = mla ? heads_local_ : groups_local_, per = heads_local_ / units;
  std::vector<float> eta(static_cast<size_t>(units), 1.0f);
  bool any = false;
  for (int64_t u = 0; u < units; ++u) {
    float g = m[static_cast<size_t>(u * per)];
    for (int64_t p = 1; p < per; ++p) g = std::max(g, m[static_cast<size_t>(u * per + p)]);
    if (clip.exceeds(g)) any = true;
    // A group at or below the bound gets min(1, t / m) = 1. One whose scores were all negative
    // is below it too and keeps 1 (Megatron's formula would give it a negative eta, whose
    // powers are NaN).
    eta[static_cast<size_t>(u)] = g > 0 ? clip.eta(g) : 1.0f;
  }
  if (!any) return {};
  std::vector<float> q(eta.size()), k(eta.size());
  for (size_t u = 0; u < eta.size(); ++u) {
    q[u] = clip.power(eta[u], clip.alpha);
    k[u] = clip.power(eta[u], 1.0 - clip.alpha);
  }
  // Rows per unit, in the weights' order: runs of (rows, factor per unit).
  auto rows = [&](const Param& w,
                  const std::vector<std::pair<int64_t, const std::vector<float>*>>& runs) {
    RowScale r{&w, {}};
    for (int64_t u = 0; u < units; ++u)
      for (const auto& [n, f] : runs)
        r.factors.insert(r.factors.end(), static_cast<size_t>(n),
                         f ? (*f)[static_cast<size_t>(u)] : 1.0f);
    MEGATRON_CHECK(static_cast<int64_t>(r.factors.size()) == w.shape[0], "qk-clip: ", w.name,
                   " has ", w.shape[0], " rows, not ", r.factors.size());
    return r;
  };
  const int64_t hn = cfg_.head_dim();
  if (!mla) {
    // linear_qkv per query group: its queries, its key, its value.
    return {rows(linear_qkv->weight(), {{per * hn, &q}, {hn, &k}, {hn, nullptr}})};
  }
  // MLA per head: the query projection [q_nope | q_pe] (q_pe by eta itself: its key k_pe is
  // shared by every head and stays), linear_kv_up_proj [k_nope | v].
  const MlaConfig& c = cfg_.mla;
  const Param& wq =
      mla->linear_q_proj ? mla->linear_q_proj->weight() : mla->linear_q_up_proj->weight();
  return {rows(wq, {{c.qk_head_dim, &q}, {c.qk_pos_emb_head_dim, &eta}}),
          rows(mla->linear_kv_up_proj.weight(), {{c.qk_head_dim, &k}, {c.v_head_dim, nullptr}})};
}

}  // namespace megatron
