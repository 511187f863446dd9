// MLP layer: fc1, GELU or SwiGLU, fc2 (scaled init).
#include "transformer/mlp.h"

#include <cmath>

#include "tensor/ops.h"

namespace megatron {

MLP::MLP(const std::string& name, const TransformerConfig& cfg)
    : linear_fc1(name + ".linear_fc1", cfg.hidden_size,
                 cfg.swiglu ? 2 * cfg.ffn_hidden_size : cfg.ffn_hidden_size, cfg.add_bias_linear,
                 cfg.init_method_std),
      linear_fc2(name + ".linear_fc2", cfg.ffn_hidden_size, cfg.hidden_size, cfg.add_bias_linear,
                 cfg.init_method_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers))),
      cfg_(cfg) {}

void MLP::collect(std::vector<Param*>& out) {
  linear_fc1.collect(out);
  linear_fc2.collect(out);
}

Tensor MLP::forward(const Tensor& x, Ctx& ctx) const {
  const int64_t rows = x.numel() / x.dim(-1);
  ctx.pre_act = linear_fc1.forward(x, ctx.fc1_ctx);
  Tensor act = Tensor::empty({rows, cfg_.ffn_hidden_size}, ctx.pre_act.dtype());
  if (cfg_.swiglu) {
    ops::swiglu_forward(act, ctx.pre_act);
  } else {
    ops::gelu_forward(act, ctx.pre_act, cfg_.openai_gelu);
  }
  return linear_fc2.forward(act, ctx.fc2_ctx).view(x.shape());
}

Tensor MLP::backward(const Tensor& dy, Ctx& ctx) const {
  Tensor dact = linear_fc2.backward(dy, ctx.fc2_ctx);
  Tensor dpre = Tensor::empty(ctx.pre_act.shape(), ctx.pre_act.dtype());
  if (cfg_.swiglu) {
    ops::swiglu_backward(dpre, dact, ctx.pre_act);
  } else {
    ops::gelu_backward(dpre, dact, ctx.pre_act, cfg_.openai_gelu);
  }
  Tensor dx = linear_fc1.backward(dpre, ctx.fc1_ctx);
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
