// Pre-norm layer: attention and MLP branches with dropout, added to the residual stream.
#include "transformer/transformer_layer.h"

#include "core/error.h"
#include "tensor/ops.h"
#include "transformer/sequence_dropout.h"

namespace megatron {

void accumulate_side_grad(Tensor& acc, const Tensor& g) {
  if (!acc.defined()) {
    acc = is_half(g.dtype()) ? g.to(DType::kF32) : g;
  } else {
    ops::add_inplace(acc, g.dtype() == acc.dtype() ? g : g.to(acc.dtype()));
  }
}

TransformerLayer::TransformerLayer(const std::string& name, const TransformerConfig& model_cfg,
                                   int64_t layer_number, const TensorParallelContext& tp,
                                   const LayerOptions& options)
    : own_cfg_(model_cfg.heterogeneous.enabled()
                   ? std::make_unique<const TransformerConfig>(model_cfg.for_layer(layer_number))
                   : nullptr),
      cfg_(own_cfg_ ? *own_cfg_ : model_cfg),
      layer_(layer_number),
      stream_layer_(layer_number + options.stream_offset),
      tp_(tp) {
  const TransformerConfig& cfg = cfg_;
  const HeterogeneousBlock* block = model_cfg.heterogeneous.block(layer_number);
  const BranchKind attention = block ? block->attention : BranchKind::kWhole;
  const BranchKind mlp_kind = block ? block->mlp : BranchKind::kWhole;
  const char type = cfg.mamba.layer_type(layer_number);
  if (type == 'M') {
    MEGATRON_CHECK(!cfg.post_layernorm && !options.cross_attention,
                   "Mamba layers are pre-LN decoder layers only");
    norm = std::make_unique<Norm>(name + ".norm", cfg);
    norm->mark_sequence_parallel(tp.sp());
    mixer = std::make_unique<MambaMixer>(name + ".mixer", cfg, layer_number, tp);
    return;
  }
  if (type != '-' && type != 'E' && attention != BranchKind::kNoOp) {
    input_layernorm = std::make_unique<Norm>(
        name + (cfg.post_layernorm ? ".post_attention_layernorm" : ".input_layernorm"), cfg);
    input_layernorm->mark_sequence_parallel(tp.sp());
    if (attention == BranchKind::kLinear) {
      linear_attention = std::make_unique<LinearReplacement>(name + ".self_attention", cfg, tp);
    } else {
      self_attention = std::make_unique<SelfAttention>(name + ".self_attention", cfg,
                                                       layer_number + options.stream_offset, tp);
    }
  }
  if (options.cross_attention) {
    MEGATRON_CHECK(
        !cfg.post_layernorm,
        "cross-attention layers are pre-LN only (drop --transformer-block-type post_ln)");
    pre_cross_attn_layernorm = std::make_unique<Norm>(name + ".pre_cross_attn_layernorm", cfg);
    pre_cross_attn_layernorm->mark_sequence_parallel(tp.sp());
    cross_attention =
        std::make_unique<CrossAttention>(name + ".cross_attention", cfg, stream_layer_, tp);
  }
  if (type == '*' || mlp_kind == BranchKind::kNoOp) return;
  pre_mlp_layernorm = std::make_unique<Norm>(
      name + (cfg.post_layernorm ? ".post_mlp_layernorm" : ".pre_mlp_layernorm"), cfg);
  pre_mlp_layernorm->mark_sequence_parallel(tp.sp());
  if (mlp_kind == BranchKind::kLinear) {
    linear_mlp = std::make_unique<LinearReplacement>(name + ".mlp", cfg, tp);
  } else if (cfg.is_moe_layer(layer_number)) {
    moe = std::make_unique<MoELayer>(name + ".mlp", cfg, layer_number, tp);
  } else {
    mlp = std::make_unique<MLP>(name + ".mlp", cfg, tp);
    mlp->set_recompute(cfg.recomputes(&RecomputeModules::mlp));
  }
}

std::vector<Fp8GemmScaling*> TransformerLayer::enable_fp8() {
  if (mixer) return mixer->enable_fp8(cfg_.fp8);
  std::vector<Fp8GemmScaling*> out;
  if (self_attention) out = self_attention->enable_fp8();
  if (cross_attention) {
    out.push_back(cross_attention->linear_q.enable_fp8(cfg_.fp8));
    out.push_back(cross_attention->linear_kv.enable_fp8(cfg_.fp8));
    out.push_back(cross_attention->linear_proj.enable_fp8(cfg_.fp8));
  }
  if (moe) {
    // The experts (TE's GroupedLinear) and the shared experts' MLP; the router's gating GEMM
    // stays in high precision, as in Megatron.
    for (Fp8GemmScaling* g : moe->experts.enable_fp8(cfg_.fp8)) out.push_back(g);
    if (moe->shared_experts) {
      out.push_back(moe->shared_experts->linear_fc1.enable_fp8(cfg_.fp8));
      out.push_back(moe->shared_experts->linear_fc2.enable_fp8(cfg_.fp8));
    }
    // LatentMoE's projections (Megatron's duplicated TELinears, FP8 inside the layer's
    // autocast): replicated over TP, so their scaling state carries the TP coordinates.
    if (moe->fc1_latent_proj) {
      out.push_back(moe->fc1_latent_proj->enable_fp8(cfg_.fp8, tp_.rank(), tp_.size()));
      out.push_back(moe->fc2_latent_proj->enable_fp8(cfg_.fp8, tp_.rank(), tp_.size()));
    }
    return out;
  }
  if (mlp) {
    out.push_back(mlp->linear_fc1.enable_fp8(cfg_.fp8));
    out.push_back(mlp->linear_fc2.enable_fp8(cfg_.fp8));
  }
  if (linear_attention) out.push_back(linear_attention->linear.enable_fp8(cfg_.fp8));
  if (linear_mlp) out.push_back(linear_mlp->linear.enable_fp8(cfg_.fp8));
  return out;
}

void TransformerLayer::collect(std::vector<Param*>& out) {
  if (mixer) {
    norm->collect(out);
    mixer->collect(out);
    return;
  }
  if (has_attention()) input_layernorm->collect(out);
  if (self_attention) self_attention->collect(out);
  if (linear_attention) linear_attention->collect(out);
  if (cross_attention) {
    pre_cross_attn_layernorm->collect(out);
    cross_attention->collect(out);
  }
  if (pre_mlp_layernorm) pre_mlp_layernorm->collect(out);
  if (mlp) mlp->collect(out);
  if (moe) moe->collect(out);
  if (linear_mlp) linear_mlp->collect(out);
}

Tensor TransformerLayer::forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                                 const ForwardMode& mode) const {
  ctx.dropout = mode.training ? static_cast<float>(cfg_.hidden_dropout) : 0.0f;
  ctx.seed = mode.seed;
  ctx.stream_attn = mode.site_stream(stream_layer_, 1);
  ctx.stream_mlp = mode.site_stream(stream_layer_, 2);
  ctx.stream_cross = mode.site_stream(stream_layer_, 5);
  if (cfg_.post_layernorm) return forward_post_ln(x, layout, ctx, mode);
  if (mixer) return forward_mamba(x, layout, ctx, mode);

  // The branches' outputs as [s', b, h], so that dropout sees the sequence (its masks are the
  // single-process ones in every layout: transformer/sequence_dropout.h).
  // Each norm's output goes to one linear layer only: it is written in the dtype that layer's
  // GEMM takes (bf16 in bf16 runs; f32 for an MoE router, which computes in f32).
  // --recompute-modules layernorm: a norm's output, kept only as the next GEMM's input, goes;
  // backward recomputes it from the norm's saved input.
  const bool drop_norms = mode.training && cfg_.recomputes(&RecomputeModules::layernorm);
  Tensor x1 = x;  // an MLP-only layer's ('-', 'E') branch adds to the input itself
  if (has_attention()) {
    Tensor a;
    if (self_attention) {
      a = self_attention
              ->forward(input_layernorm->forward(x, ctx.ln1, self_attention->gemm_input_dtype()),
                        layout, ctx.attn, mode)
              .view(x.shape());
      if (drop_norms) {
        self_attention->drop_input(ctx.attn);
        ctx.ln1_dropped = true;
      }
    } else {
      a = linear_attention
              ->forward(input_layernorm->forward(x, ctx.ln1, linear_attention->gemm_input_dtype()),
                        ctx.linear_attention)
              .view(x.shape());
    }
    x1 = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (ctx.dropout > 0)
      sequence_dropout_forward(a, a, ctx.dropout, ctx.seed, ctx.stream_attn, tp_, true);
    ops::add(x1, x, a);
  }

  if (cross_attention) {  // x1 = x1 + dropout(cross_attention(pre_cross_attn_layernorm(x1)))
    MEGATRON_CHECK(layout.memory.defined(), "a decoder layer needs the encoder's output");
    Tensor c = cross_attention
                   ->forward(pre_cross_attn_layernorm->forward(
                                 x1, ctx.ln_cross, cross_attention->linear_q.gemm_input_dtype()),
                             layout.memory, layout.memory_valid, ctx.cross, mode)
                   .view(x.shape());
    if (ctx.dropout > 0)
      sequence_dropout_forward(c, c, ctx.dropout, ctx.seed, ctx.stream_cross, tp_, true);
    ops::add_inplace(c, x1);
    x1 = c;
  }

  // An attention-only layer ('*'); a copy when both branches are no-ops, so that the layer's
  // output never aliases its input.
  if (!has_mlp()) return has_attention() || cross_attention ? x1 : x.clone();
  const Tensor normed = pre_mlp_layernorm->forward(x1, ctx.ln2, mlp_input_dtype(x1));
  Tensor m = ffn_forward(normed, ctx, mode).view(x.shape());
  if (drop_norms && (mlp || ctx.moe_input.defined())) {
    if (mlp) mlp->drop_input(ctx.mlp);
    ctx.moe_input = Tensor();
    ctx.ln2_dropped = true;
  }
  if (ctx.dropout > 0)
    sequence_dropout_forward(m, m, ctx.dropout, ctx.seed, ctx.stream_mlp, tp_, true);
  ops::add_inplace(m, x1);  // out = x1 + dropout(mlp(...)), reusing m's storage
  return m;
}

DType TransformerLayer::mlp_input_dtype(const Tensor& x) const {
  if (moe) return x.dtype();  // the router computes in f32
  return mlp ? mlp->linear_fc1.gemm_input_dtype() : linear_mlp->gemm_input_dtype();
}

Tensor TransformerLayer::ffn_forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const {
  if (linear_mlp) return linear_mlp->forward(x, ctx.linear_mlp);
  if (!moe) return mlp->forward(x, ctx.mlp);
  Tensor y = moe->forward(x, ctx.moe, mode);
  if (mode.training && cfg_.recomputes(&RecomputeModules::moe)) {
    // Only the input (and the mode: the same dropout-free routing, the same loss scale) stays;
    // backward routes and dispatches again, with the same results (the router logs its losses
    // and counts in backward, once).
    ctx.moe = MoELayer::Ctx{};
    ctx.moe_input = x;
    ctx.moe_mode = mode;
  }
  return y;
}

Tensor TransformerLayer::ffn_backward(const Tensor& dy, Ctx& ctx) const {
  if (linear_mlp) return linear_mlp->backward(dy, ctx.linear_mlp);
  if (!moe) return mlp->backward(dy, ctx.mlp);
  if (ctx.moe_input.defined()) {
    moe->forward(ctx.moe_input, ctx.moe, ctx.moe_mode);
    ctx.moe_input = Tensor();
  }
  return moe->backward(dy, ctx.moe);
}

Tensor TransformerLayer::forward_post_ln(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                                         const ForwardMode& mode) const {
  Tensor a = self_attention->forward(x, layout, ctx.attn, mode).view(x.shape());
  if (ctx.dropout > 0)
    sequence_dropout_forward(a, a, ctx.dropout, ctx.seed, ctx.stream_attn, tp_, true);
  ops::add_inplace(a, x);  // a = x + dropout(attention(x))
  const Tensor x1 = input_layernorm->forward(a, ctx.ln1);
  Tensor m = ffn_forward(x1, ctx, mode).view(x.shape());
  if (ctx.dropout > 0)
    sequence_dropout_forward(m, m, ctx.dropout, ctx.seed, ctx.stream_mlp, tp_, true);
  ops::add_inplace(m, x1);
  return pre_mlp_layernorm->forward(m, ctx.ln2);
}

Tensor TransformerLayer::backward_post_ln(const Tensor& dy, Ctx& ctx, SideGrads* side) const {
  // d(x1 + mlp branch) through the second norm; x1 gets it directly and through the MLP.
  Tensor d2 = pre_mlp_layernorm->backward(dy, ctx.ln2);
  Tensor dm = d2;
  if (ctx.dropout > 0) {
    dm = Tensor::empty(d2.shape(), d2.dtype(), d2.device());
    sequence_dropout_backward(dm, d2, ctx.dropout, ctx.seed, ctx.stream_mlp, tp_, true);
  }
  Tensor dx1 = ffn_backward(dm, ctx).view(dy.shape());
  ops::add_inplace(dx1, d2);
  Tensor d1 = input_layernorm->backward(dx1, ctx.ln1);
  Tensor da = d1;
  if (ctx.dropout > 0) {
    da = Tensor::empty(d1.shape(), d1.dtype(), d1.device());
    sequence_dropout_backward(da, d1, ctx.dropout, ctx.seed, ctx.stream_attn, tp_, true);
  }
  Tensor dbias;
  Tensor dx = self_attention->backward(da, ctx.attn, &dbias).view(dy.shape());
  if (dbias.defined() && side) accumulate_side_grad(side->bias, dbias);
  ops::add_inplace(dx, d1);
  ctx = Ctx{};
  return dx;
}

Tensor TransformerLayer::backward(const Tensor& dy, Ctx& ctx, SideGrads* side) const {
  if (cfg_.post_layernorm) return backward_post_ln(dy, ctx, side);
  if (mixer) return backward_mamba(dy, ctx);
  // dx1 = dy + d(pre_mlp_layernorm input)
  Tensor dx1 = dy;  // an attention-only layer's ('*') residual gradient
  if (has_mlp()) {
    Tensor dm = dy;
    if (ctx.dropout > 0) {
      dm = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
      sequence_dropout_backward(dm, dy, ctx.dropout, ctx.seed, ctx.stream_mlp, tp_, true);
    }
    if (ctx.ln2_dropped) {  // layernorm's recomputation of the pre-MLP norm's output
      Norm::Ctx again;
      const Tensor normed =
          pre_mlp_layernorm->forward(ctx.ln2.x, again, mlp_input_dtype(ctx.ln2.x));
      if (mlp) {
        mlp->keep_input(normed, ctx.mlp);
      } else {
        ctx.moe_input = normed;
      }
    }
    const Tensor dmlp = ffn_backward(dm, ctx);
    dx1 = pre_mlp_layernorm->backward(dmlp.view(dy.shape()), ctx.ln2);
    ops::add_inplace(dx1, dy);
  }

  if (cross_attention) {  // through the cross-attention branch to x1 and the memory
    Tensor dc = dx1;
    if (ctx.dropout > 0) {
      dc = Tensor::empty(dx1.shape(), dx1.dtype(), dx1.device());
      sequence_dropout_backward(dc, dx1, ctx.dropout, ctx.seed, ctx.stream_cross, tp_, true);
    }
    Tensor dmemory;
    const Tensor dn = cross_attention->backward(dc, ctx.cross, &dmemory);
    MEGATRON_CHECK(side != nullptr, "a decoder layer's backward needs SideGrads for the memory");
    accumulate_side_grad(side->memory, dmemory);
    Tensor d = pre_cross_attn_layernorm->backward(dn.view(dy.shape()), ctx.ln_cross);
    ops::add_inplace(d, dx1);
    dx1 = d;
  }

  if (!has_attention()) {  // an MLP-only layer ('-', 'E') or a no-op attention
    ctx = Ctx{};
    return dx1;
  }
  Tensor da = dx1;
  if (ctx.dropout > 0) {
    da = Tensor::empty(dx1.shape(), dx1.dtype(), dx1.device());
    sequence_dropout_backward(da, dx1, ctx.dropout, ctx.seed, ctx.stream_attn, tp_, true);
  }
  if (linear_attention) {
    Tensor dx = input_layernorm->backward(
        linear_attention->backward(da, ctx.linear_attention).view(dy.shape()), ctx.ln1);
    ops::add_inplace(dx, dx1);
    ctx = Ctx{};
    return dx;
  }
  if (ctx.ln1_dropped) {  // layernorm's recomputation of the input norm's output
    Norm::Ctx again;
    self_attention->keep_input(
        input_layernorm->forward(ctx.ln1.x, again, self_attention->gemm_input_dtype()), ctx.attn);
  }
  Tensor dbias;
  Tensor dx = input_layernorm->backward(self_attention->backward(da, ctx.attn, &dbias), ctx.ln1);
  if (dbias.defined()) {
    MEGATRON_CHECK(side != nullptr, "a biased attention's backward needs SideGrads");
    accumulate_side_grad(side->bias, dbias);
  }
  ops::add_inplace(dx, dx1);
  ctx = Ctx{};
  return dx;
}

Tensor TransformerLayer::forward_mamba(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                                       const ForwardMode& mode) const {
  const Tensor docs = layout.packed ? layout.whole_doc_start : Tensor();
  Tensor m = mixer
                 ->forward(norm->forward(x, ctx.ln_mamba, mixer->gemm_input_dtype()), docs,
                           ctx.mamba, mode)
                 .view(x.shape());
  if (ctx.dropout > 0)
    sequence_dropout_forward(m, m, ctx.dropout, ctx.seed, ctx.stream_attn, tp_, true);
  ops::add_inplace(m, x);  // out = x + dropout(mixer(norm(x)))
  return m;
}

Tensor TransformerLayer::backward_mamba(const Tensor& dy, Ctx& ctx) const {
  Tensor dm = dy;
  if (ctx.dropout > 0) {
    dm = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    sequence_dropout_backward(dm, dy, ctx.dropout, ctx.seed, ctx.stream_attn, tp_, true);
  }
  Tensor dx = norm->backward(mixer->backward(dm, ctx.mamba).view(dy.shape()), ctx.ln_mamba);
  ops::add_inplace(dx, dy);
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
