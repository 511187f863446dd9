// TransformerBlock: a stack of TransformerLayers followed by the final norm (Megatron's
// "decoder"), or, in a pipeline stage, a contiguous run of the model's layers, with the final norm
// only on the last stage. Layers keep their global numbers (names and dropout streams), so a
// layer is the same in every pipeline layout. Layers are held by pointer: they are not movable
// (their Params are referenced by the ParamSet).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "transformer/transformer_layer.h"

namespace megatron {

// Told, during backward, of parameters whose gradient that backward has finished (the
// data-parallel reducer launches a bucket's all-reduce as soon as all of it is final).
using ParamsDone = std::function<void(const std::vector<const Param*>&)>;

class TransformerBlock {
 public:
  struct Ctx {
    std::vector<TransformerLayer::Ctx> layers;
    Norm::Ctx final_norm;
  };

  // Layers [first_layer, first_layer + num_layers) of cfg.num_layers; with_final_norm on the
  // stage that ends the decoder.
  TransformerBlock(const std::string& name, const TransformerConfig& cfg,
                   const TensorParallelContext& tp, int64_t first_layer, int64_t num_layers,
                   bool with_final_norm);

  Tensor forward(const Tensor& x, const TokenLayout& layout, Ctx& ctx,
                 const ForwardMode& mode) const;
  // `done` (optional) is called after the final norm's and after each layer's backward.
  Tensor backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done = {}) const;
  void collect(std::vector<Param*>& out);

  std::vector<std::unique_ptr<TransformerLayer>> layers;
  Norm final_layernorm;
  bool has_final_norm() const { return has_final_norm_; }

 private:
  bool has_final_norm_;
  std::vector<const Param*> final_norm_params_;
};

}  // namespace megatron
