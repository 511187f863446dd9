// The decoder stack: layers in order forward, reverse order backward, then the final norm; full
// recomputation by segments (only a segment's input kept, its forward re-run in backward).
#include "transformer/transformer_block.h"

#include <algorithm>

namespace megatron {

std::vector<TransformerBlock::Segment> recompute_segments(const TransformerConfig& cfg,
                                                          int64_t num_layers) {
  const bool full = cfg.recompute_granularity == RecomputeGranularity::kFull;
  MEGATRON_CHECK(full || cfg.recompute_method == RecomputeMethod::kNone,
                 "recompute_method (--recompute-method) requires recompute_granularity full "
                 "(--recompute-granularity full)");
  std::vector<TransformerBlock::Segment> out;
  if (!full) {
    for (int64_t i = 0; i < num_layers; ++i) out.push_back({i, i + 1, false});
    return out;
  }
  MEGATRON_CHECK(cfg.recompute_method != RecomputeMethod::kNone,
                 "recompute_granularity full needs recompute_method uniform or block "
                 "(--recompute-method)");
  const int64_t n = cfg.recompute_num_layers;
  MEGATRON_CHECK(n >= 1,
                 "recompute_granularity full needs recompute_num_layers >= 1 "
                 "(--recompute-num-layers), got ",
                 n);
  if (cfg.recompute_method == RecomputeMethod::kUniform) {
    for (int64_t i = 0; i < num_layers; i += n)
      out.push_back({i, std::min(i + n, num_layers), true});
  } else {
    // A model chunk of an interleaved pipeline may hold fewer than n layers: all of them
    // recompute then.
    for (int64_t i = 0; i < num_layers; ++i) out.push_back({i, i + 1, i < n});
  }
  return out;
}

TransformerBlock::TransformerBlock(const std::string& name, const TransformerConfig& cfg,
                                   const TensorParallelContext& tp, int64_t first_layer,
                                   int64_t num_layers, bool with_final_norm,
                                   const LayerOptions& options)
    : final_layernorm(name + ".final_layernorm", cfg),
      // A post-norm stack ends normalised already (its last layer's norm).
      has_final_norm_(with_final_norm && !cfg.post_layernorm),
      segments_(recompute_segments(cfg, num_layers)) {
  MEGATRON_ASSERT(first_layer >= 0 && num_layers >= 0 && first_layer + num_layers <= cfg.num_layers,
                  "layers [", first_layer, ", ", first_layer + num_layers, ") of ", cfg.num_layers);
  for (int64_t i = first_layer; i < first_layer + num_layers; ++i) {
    layers.push_back(std::make_unique<TransformerLayer>(name + ".layers." + std::to_string(i), cfg,
                                                        i, tp, options));
  }
  // FP8: every GEMM of the layers that run in FP8 (--first-last-layers-bf16 keeps some out).
  for (auto& l : layers) {
    if (!cfg.fp8.layer_in_fp8(l->layer_number(), cfg.num_layers)) continue;
    if (!fp8_) fp8_ = std::make_unique<Fp8Region>();
    for (Fp8GemmScaling* g : l->enable_fp8()) fp8_->add(g);
  }
  amax_group_ = tp.amax;
  // Megatron's split_tensor_into_1d_equal_chunks / gather_split_1d_tensor over the TP group.
  if (cfg.distribute_saved_activations && tp.group && tp.size() > 1) {
    MEGATRON_CHECK(!tp.sp(),
                   "--distribute-saved-activations must be false when sequence "
                   "parallel is enabled (Megatron's rule)");
    tp_group_ = tp.group;
  }
  final_layernorm.mark_sequence_parallel(tp.sp());
  std::vector<Param*> ps;
  final_layernorm.collect(ps);
  final_norm_params_.assign(ps.begin(), ps.end());
}

void TransformerBlock::collect(std::vector<Param*>& out) {
  for (auto& l : layers) l->collect(out);
  if (has_final_norm_) final_layernorm.collect(out);
}

Tensor TransformerBlock::forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                                 const ForwardMode& mode) const {
  ctx.layers.resize(layers.size());
  ctx.segment_inputs.assign(segments_.size(), Tensor());
  ctx.segment_shapes.assign(segments_.size(), Shape());
  Tensor h = x;
  if (fp8_) {
    fp8_->begin_forward(mode.training, mode.first_micro_batch);
    ctx.fp8_scales.clear();
  }
  for (size_t k = 0; k < segments_.size(); ++k) {
    const Segment& seg = segments_[k];
    if (seg.recompute) {
      ctx.segment_inputs[k] = h;
      ctx.segment_shapes[k] = h.shape();
      if (tp_group_ && mode.training) {
        const int64_t n = h.numel(), p = tp_group_->size();
        MEGATRON_CHECK(n % p == 0, "--distribute-saved-activations: a segment input of ", n,
                       " elements does not split into ", p, " equal parts");
        Tensor mine = Tensor::empty({n / p}, h.dtype(), h.device());
        mine.copy_from(h.flat_view(tp_group_->rank() * (n / p), {n / p}));
        ctx.segment_inputs[k] = mine;
      }
      ctx.layout = layout;
      ctx.mode = mode;
      if (fp8_ && ctx.fp8_scales.empty()) ctx.fp8_scales = fp8_->forward_scales();
    }
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      std::vector<const Param*> ps;
      if (mode.gate) {
        ps = layer_params(i);
        mode.need(ps);
      }
      h = layers[i]->forward(h, layout, ctx.layers[i], mode);
      mode.release(ps);
      // What backward would need is dropped here and rebuilt by the recomputation.
      if (seg.recompute) ctx.layers[i] = TransformerLayer::Ctx{};
    }
  }
  if (fp8_) fp8_->end_forward(mode.training, amax_group_);
  if (!has_final_norm_) return h;
  mode.need(final_norm_params_);
  Tensor out = final_layernorm.forward(h, ctx.final_norm);
  mode.release(final_norm_params_);
  return out;
}

std::vector<const Param*> TransformerBlock::layer_params(int64_t i) const {
  std::vector<Param*> ps;
  layers[static_cast<size_t>(i)]->collect(ps);
  return std::vector<const Param*>(ps.begin(), ps.end());
}

Tensor TransformerBlock::backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done,
                                  SideGrads* side) const {
  Tensor d = dy;
  if (fp8_) fp8_->begin_backward();
  if (has_final_norm_) {
    done.begin(final_norm_params_);
    d = final_layernorm.backward(dy, ctx.final_norm);
    if (done) done(final_norm_params_);
  }
  for (size_t k = segments_.size(); k-- > 0;) {
    const Segment& seg = segments_[k];
    if (seg.recompute) {
      // The same forward, from the same input with the same mode, as in forward: same kernels
      // on the same values, so the rebuilt Ctx is bit for bit the one that was dropped. The
      // segment's output is not needed (its gradient is d).
      // FP8: with the scales the forward used, recording nothing (TE's recompute phase).
      Tensor h = ctx.segment_inputs[k];
      if (tp_group_ && h.numel() != ctx.segment_shapes[k].numel()) {
        Tensor whole = Tensor::empty({h.numel() * tp_group_->size()}, h.dtype(), h.device());
        tp_group_->all_gather(whole, h);
        h = whole.view(ctx.segment_shapes[k]);
      }
      // The whole segment's weights, read by the recomputation and then by each backward.
      if (done) {
        for (int64_t i = seg.begin; i < seg.end; ++i) done.begin(layer_params(i));
      }
      if (fp8_) fp8_->begin_recompute(ctx.fp8_scales);
      for (int64_t i = seg.begin; i < seg.end; ++i) {
        h = layers[i]->forward(h, ctx.layout, ctx.layers[i], ctx.mode);
      }
      if (fp8_) fp8_->end_recompute();
      ctx.segment_inputs[k] = Tensor();
    }
    for (int64_t i = seg.end; i-- > seg.begin;) {
      if (done && !seg.recompute) done.begin(layer_params(i));
      d = layers[i]->backward(d, ctx.layers[i], side);
      if (done) done(layer_params(i));
    }
  }
  if (fp8_) fp8_->end_backward(amax_group_);
  ctx = Ctx{};
  return d;
}

}  // namespace megatron
