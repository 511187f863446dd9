// The decoder stack: layers in order forward, reverse order backward, then the final norm.
#include "transformer/transformer_block.h"

namespace megatron {

TransformerBlock::TransformerBlock(const std::string& name, const TransformerConfig& cfg)
    : final_layernorm(name + ".final_layernorm", cfg.hidden_size, cfg.normalization,
                      cfg.norm_epsilon) {
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    layers.push_back(
        std::make_unique<TransformerLayer>(name + ".layers." + std::to_string(i), cfg, i));
  }
}

void TransformerBlock::collect(std::vector<Param*>& out) {
  for (auto& l : layers) l->collect(out);
  final_layernorm.collect(out);
}

Tensor TransformerBlock::forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                                 const ForwardMode& mode) const {
  ctx.layers.resize(layers.size());
  Tensor h = x;
  for (size_t i = 0; i < layers.size(); ++i) h = layers[i]->forward(h, layout, ctx.layers[i], mode);
  return final_layernorm.forward(h, ctx.final_norm);
}

Tensor TransformerBlock::backward(const Tensor& dy, Ctx& ctx) const {
  Tensor d = final_layernorm.backward(dy, ctx.final_norm);
  for (size_t i = layers.size(); i-- > 0;) d = layers[i]->backward(d, ctx.layers[i]);
  ctx = Ctx{};
  return d;
}

}  // namespace megatron
