// TransformerBlock: a stack of TransformerLayers followed by the final norm (Megatron's
// "decoder"). Layers are held by pointer: they are not movable (their Params are referenced by
// the ParamSet).
#pragma once

#include <memory>
#include <vector>

#include "transformer/transformer_layer.h"

namespace megatron {

class TransformerBlock {
 public:
  struct Ctx {
    std::vector<TransformerLayer::Ctx> layers;
    Norm::Ctx final_norm;
  };

  TransformerBlock(const std::string& name, const TransformerConfig& cfg);

  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  Tensor backward(const Tensor& dy, Ctx& ctx) const;
  void collect(std::vector<Param*>& out);

  std::vector<std::unique_ptr<TransformerLayer>> layers;
  Norm final_layernorm;
};

}  // namespace megatron
