// MLP layer: fc1, GELU, SwiGLU, GeGLU or quick GeGLU, fc2 (scaled init).
#include "transformer/mlp.h"

#include <cmath>

#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {

namespace {

// GeGLU on [gate | up] rows: out = gelu(gate) * up; backward through both halves.
struct GluHalves {
  Tensor gate, up;
};
GluHalves glu_halves(const Tensor& x) {
  const int64_t f = x.dim(x.ndim() - 1) / 2, rows = x.numel() / (2 * f);
  const Tensor flat = x.view({rows, 2 * f});
  GluHalves h{Tensor::empty({rows, f}, x.dtype(), x.device()),
              Tensor::empty({rows, f}, x.dtype(), x.device())};
  ops::slice_last_dim(h.gate, flat, 0);
  ops::slice_last_dim(h.up, flat, f);
  return h;
}

void geglu_forward(Tensor& out, const Tensor& x, bool tanh_approx) {
  GluHalves h = glu_halves(x);
  Tensor g = Tensor::empty(h.gate.shape(), x.dtype(), x.device());
  ops::gelu_forward(g, h.gate, tanh_approx);
  Tensor flat = out.view(g.shape());
  ops::mul(flat, g, h.up);
}

void geglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx) {
  GluHalves h = glu_halves(x);
  const Tensor d = dout.view(h.gate.shape());
  Tensor g = Tensor::empty(h.gate.shape(), x.dtype(), x.device());
  ops::gelu_forward(g, h.gate, tanh_approx);
  Tensor dup = Tensor::empty(g.shape(), x.dtype(), x.device()),
         dg = Tensor::empty(g.shape(), x.dtype(), x.device());
  ops::mul(dup, d, g);    // d up = dout * gelu(gate)
  ops::mul(dg, d, h.up);  // d gelu(gate) = dout * up
  Tensor dgate = Tensor::empty(g.shape(), x.dtype(), x.device());
  ops::gelu_backward(dgate, dg, h.gate, tanh_approx);
  Tensor flat = dx.view({g.dim(0), 2 * g.dim(1)});
  ops::concat_last_dim(flat, {dgate, dup});
}

// Plain GELU after a biased fc1: Megatron's bias-GELU fusion applies (fc1 skips its bias, the
// activation adds it).
bool fuses_bias_gelu(const TransformerConfig& cfg) {
  return cfg.add_bias_linear && !cfg.gated_mlp() && !cfg.squared_relu && !cfg.quick_gelu;
}

}  // namespace

void mlp_activation_forward(const TransformerConfig& cfg, Tensor& out, const Tensor& x) {
  if (cfg.quick_geglu) {
    ops::quick_geglu_forward(out, x, cfg.glu_linear_offset, cfg.activation_clamp);
  } else if (cfg.gated_gelu) {
    geglu_forward(out, x, cfg.openai_gelu);
  } else if (cfg.swiglu) {
    ops::swiglu_forward(out, x);
  } else if (cfg.squared_relu) {
    ops::squared_relu_forward(out, x);
  } else if (cfg.quick_gelu) {
    ops::quick_gelu_forward(out, x);
  } else {
    ops::gelu_forward(out, x, cfg.openai_gelu);
  }
}

void mlp_activation_backward(const TransformerConfig& cfg, Tensor& dx, const Tensor& dout,
                             const Tensor& x) {
  if (cfg.quick_geglu) {
    ops::quick_geglu_backward(dx, dout, x, cfg.glu_linear_offset, cfg.activation_clamp);
  } else if (cfg.gated_gelu) {
    geglu_backward(dx, dout, x, cfg.openai_gelu);
  } else if (cfg.swiglu) {
    ops::swiglu_backward(dx, dout, x);
  } else if (cfg.squared_relu) {
    ops::squared_relu_backward(dx, dout, x);
  } else if (cfg.quick_gelu) {
    ops::quick_gelu_backward(dx, dout, x);
  } else {
    ops::gelu_backward(dx, dout, x, cfg.openai_gelu);
  }
}

MLP::MLP(const std::string& name, const TransformerConfig& cfg, const TensorParallelContext& tp)
    : linear_fc1(name + ".linear_fc1", cfg.hidden_size,
                 cfg.gated_mlp() ? 2 * cfg.ffn_hidden_size : cfg.ffn_hidden_size,
                 cfg.init_method_std, *tp.group,
                 {.with_bias = cfg.add_bias_linear,
                  .sequence_parallel = tp.sp(),
                  .stride = cfg.gated_mlp() ? 2 : 1,
                  .skip_bias_add = fuses_bias_gelu(cfg)}),
      linear_fc2(name + ".linear_fc2", cfg.ffn_hidden_size, cfg.hidden_size, cfg.output_init_std(),
                 *tp.group,
                 {.with_bias = cfg.add_bias_linear,
                  .input_is_parallel = true,
                  .sequence_parallel = tp.sp()}),
      cfg_(cfg),
      ffn_local_(divide(cfg.ffn_hidden_size, tp.size(),
                        "--ffn-hidden-size by --tensor-model-parallel-size")) {}

void MLP::collect(std::vector<Param*>& out) {
  linear_fc1.collect(out);
  linear_fc2.collect(out);
}

Tensor MLP::forward(const Tensor& x, Ctx& ctx) const {
  Tensor y = run(x, ctx);
  if (recompute_) {
    ctx = Ctx{};
    ctx.input = x;
  }
  return y;
}

void MLP::drop_input(Ctx& ctx) const {
  ctx.input = Tensor();
  ctx.fc1_ctx.linear.x = Tensor();
}

void MLP::keep_input(const Tensor& x, Ctx& ctx) const {
  if (recompute_) {
    ctx.input = x;  // the whole MLP runs again from it
  } else {
    linear_fc1.keep_input(x, ctx.fc1_ctx);
  }
}

Tensor MLP::run(const Tensor& x, Ctx& ctx) const {
  ctx.pre_act = linear_fc1.forward(x, ctx.fc1_ctx);  // all s positions, also under SP
  Shape act_shape = ctx.pre_act.shape();
  act_shape[-1] = ffn_local_;
  if (fuses_bias_gelu(cfg_)) {
    // The activation is written in fc2's GEMM-input dtype (bf16 in bf16 runs); pre_act gets the
    // bias added in the same pass, as the backward needs it.
    Tensor act = Tensor::empty(act_shape, linear_fc2.gemm_input_dtype(), ctx.pre_act.device());
    ops::bias_gelu_forward(act, ctx.pre_act, linear_fc1.bias().value_as(ctx.pre_act.dtype()),
                           cfg_.openai_gelu);
    return linear_fc2.forward(act, ctx.fc2_ctx);
  }
  Tensor act = Tensor::empty(act_shape, ctx.pre_act.dtype(), ctx.pre_act.device());
  mlp_activation_forward(cfg_, act, ctx.pre_act);
  return linear_fc2.forward(act, ctx.fc2_ctx);
}

Tensor MLP::backward(const Tensor& dy, Ctx& ctx) const {
  if (ctx.input.defined()) run(ctx.input, ctx);  // recompute(): the dropped forward
  Tensor dact = linear_fc2.backward(dy, ctx.fc2_ctx);
  Tensor dpre = Tensor::empty(ctx.pre_act.shape(), ctx.pre_act.dtype(), ctx.pre_act.device());
  mlp_activation_backward(cfg_, dpre, dact, ctx.pre_act);
  // With the fusion fc1 leaves its bias gradient to the MLP (Linear::set_skip_bias_add). (A fused
  // backward with the bias sum was measured slower on CPUs: summing each column in row order, as
  // bias_backward does for reproducible bits, walks the rows a column range at a time.)
  if (fuses_bias_gelu(cfg_) && linear_fc1.bias().main_grad.defined()) {
    Tensor db = linear_fc1.bias().main_grad;
    ops::bias_backward(db, dpre);
  }
  Tensor dx = linear_fc1.backward(dpre, ctx.fc1_ctx);
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
