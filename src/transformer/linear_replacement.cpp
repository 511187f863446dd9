// The linear replacement of an attention or MLP block: a gathered column-parallel linear.
#include "transformer/linear_replacement.h"

#include "parallel/mappings.h"

namespace megatron {

LinearReplacement::LinearReplacement(const std::string& name, const TransformerConfig& cfg,
                                     const TensorParallelContext& tp)
    : linear(
          name, cfg.hidden_size, cfg.hidden_size, cfg.init_method_std, *tp.group,
          {.with_bias = cfg.add_bias_linear, .gather_output = true, .sequence_parallel = tp.sp()}),
      tp_(tp) {}

Tensor LinearReplacement::forward(const Tensor& x, Ctx& ctx) const {
  Tensor y = linear.forward(x, ctx);  // [s, b, h] on every rank
  return tp_.sp() ? scatter_to_sequence_parallel_region_forward(y, *tp_.group) : y;
}

Tensor LinearReplacement::backward(const Tensor& dy, Ctx& ctx) const {
  const Tensor d = tp_.sp() ? scatter_to_sequence_parallel_region_backward(dy, *tp_.group) : dy;
  Tensor dx = linear.backward(d, ctx);
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
