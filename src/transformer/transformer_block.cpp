// The decoder stack: layers in order forward, reverse order backward, then the final norm.
#include "transformer/transformer_block.h"

namespace megatron {

TransformerBlock::TransformerBlock(const std::string& name, const TransformerConfig& cfg,
                                   const TensorParallelContext& tp, int64_t first_layer,
                                   int64_t num_layers, bool with_final_norm)
    : final_layernorm(name + ".final_layernorm", cfg.hidden_size, cfg.normalization,
                      cfg.norm_epsilon),
      has_final_norm_(with_final_norm) {
  MEGATRON_ASSERT(first_layer >= 0 && num_layers >= 0 && first_layer + num_layers <= cfg.num_layers,
                  "layers [", first_layer, ", ", first_layer + num_layers, ") of ", cfg.num_layers);
  for (int64_t i = first_layer; i < first_layer + num_layers; ++i) {
    layers.push_back(
        std::make_unique<TransformerLayer>(name + ".layers." + std::to_string(i), cfg, i, tp));
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
  Tensor h = x;
  for (size_t i = 0; i < layers.size(); ++i) h = layers[i]->forward(h, layout, ctx.layers[i], mode);
  return has_final_norm_ ? final_layernorm.forward(h, ctx.final_norm) : h;
}

Tensor TransformerBlock::backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done) const {
  Tensor d = dy;
  if (has_final_norm_) {
    d = final_layernorm.backward(dy, ctx.final_norm);
    if (done) done(final_norm_params_);
  }
  for (size_t i = layers.size(); i-- > 0;) {
    d = layers[i]->backward(d, ctx.layers[i]);
    if (done) {
      std::vector<Param*> ps;
      layers[i]->collect(ps);
      done(std::vector<const Param*>(ps.begin(), ps.end()));
    }
  }
  ctx = Ctx{};
  return d;
}

}  // namespace megatron
