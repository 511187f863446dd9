// VisionProjection: Megatron's MultimodalProjector, from the vision encoder's width to the
// language model's hidden size (LLaVA's "multi_modal_projector").
//
//   mlp    (--vision-projection-type mlp, the default): linear_fc1 (h_v -> ffn, bias), exact
//          GELU, linear_fc2 (ffn -> h, bias); ffn is --vision-projection-ffn-hidden-size, by
//          default the LM's hidden size (Hugging Face LLaVA's linear_1 / linear_2).
//   affine (--vision-projection-type affine): one linear layer h_v -> h with bias.
//
// Tensor parallelism as Megatron's: fc1 column parallel, fc2 row parallel (its sum makes the
// output whole on every TP rank); the affine layer is column parallel with the output gathered.
// No sequence parallelism (Megatron disables it in the projection). Input [rows..., h_v], output
// [rows..., h].
#pragma once

#include <vector>

#include "parallel/tensor_parallel_linear.h"
#include "transformer/config.h"
#include "transformer/forward_mode.h"
#include "transformer/tensor_parallel_context.h"
#include "transformer/transformer_block.h"  // ParamsDone

namespace megatron {

class VisionProjection {
 public:
  struct Ctx {
    ColumnParallelLinear::Ctx fc1;
    RowParallelLinear::Ctx fc2;
    Tensor pre_act;  // fc1's output (mlp)
  };

  // lm: the language model's config (hidden size, init) with its `vision` part; h_v: the vision
  // encoder's hidden size.
  VisionProjection(const TransformerConfig& lm, int64_t vision_hidden,
                   const TensorParallelContext& tp);

  Tensor forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const;
  // Returns the input's gradient; accumulates the parameters'.
  Tensor backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done = {}) const;
  void collect(std::vector<Param*>& out);
  bool affine() const { return affine_; }

  ColumnParallelLinear linear_fc1;  // vision_projection.encoder.linear_fc1 (the affine layer:
                                    // vision_projection.encoder)
  std::unique_ptr<RowParallelLinear> linear_fc2;  // mlp only

 private:
  std::vector<const Param*> params() const;
  bool affine_;
};

}  // namespace megatron
