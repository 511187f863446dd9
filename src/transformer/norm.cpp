// LayerNorm / RMSNorm layer over the ops; bf16 weights are widened to f32 per call.
#include "transformer/norm.h"

#include "core/error.h"
#include "tensor/ops.h"

namespace megatron {

Norm::Norm(const std::string& name, int64_t hidden, Normalization kind, double eps,
           bool zero_centered_gamma, bool learnable)
    : kind_(kind),
      eps_(static_cast<float>(eps)),
      zero_centered_(zero_centered_gamma),
      learnable_(learnable),
      hidden_(hidden) {
  MEGATRON_ASSERT(learnable || kind == Normalization::kRMSNorm,
                  "a norm without parameters is an RMSNorm");
  weight.name = name + ".weight";
  weight.shape = {hidden};
  weight.init = zero_centered_gamma ? Init::kZeros : Init::kOnes;
  weight.no_weight_decay = true;
  if (kind == Normalization::kLayerNorm) {
    bias.name = name + ".bias";
    bias.shape = {hidden};
    bias.init = Init::kZeros;
    bias.no_weight_decay = true;
  }
}

void Norm::collect(std::vector<Param*>& out) {
  if (!learnable_) return;
  out.push_back(&weight);
  if (kind_ == Normalization::kLayerNorm) out.push_back(&bias);
}

Tensor Norm::gamma(DType dtype, Device where) const {
  if (!learnable_) return Tensor::full({hidden_}, 1.0, dtype, where);
  if (!zero_centered_) return weight.value_as(dtype);
  const Device device = weight.value.device();
  Tensor g = Tensor::empty(weight.shape, dtype, device);
  ops::add(g, weight.value_as(dtype), Tensor::full(weight.shape, 1.0, dtype, device));
  return g;
}

Tensor Norm::forward(const Tensor& x, Ctx& ctx, DType out) const {
  const int64_t rows = x.numel() / x.dim(-1);
  Tensor y = Tensor::empty(x.shape(), out, x.device());
  ctx.x = x;
  ctx.rstd = Tensor::empty({rows}, x.dtype(), x.device());
  if (kind_ == Normalization::kLayerNorm) {
    ctx.mean = Tensor::empty({rows}, x.dtype(), x.device());
    ops::layernorm_forward(y, ctx.mean, ctx.rstd, x, gamma(x.dtype(), x.device()),
                           bias.value_as(x.dtype()), eps_);
  } else {
    ops::rmsnorm_forward(y, ctx.rstd, x, gamma(x.dtype(), x.device()), eps_);
  }
  return y;
}

Tensor Norm::backward(const Tensor& dy, Ctx& ctx) const {
  Tensor dx = Tensor::empty(ctx.x.shape(), ctx.x.dtype(), ctx.x.device());
  // A frozen norm without gradient storage (Param::requires_grad): its kernel still computes
  // weight and bias gradients, into scratch (the norms are vectors of h).
  auto grad_of = [&](const Param& p) {
    if (p.main_grad.defined()) return p.main_grad;
    return Tensor::zeros(p.shape, ctx.x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32,
                         ctx.x.device());
  };
  // Without parameters the kernel's weight gradient goes to scratch.
  Tensor dw = learnable_ ? grad_of(weight)
                         : Tensor::zeros({hidden_},
                                         ctx.x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32,
                                         ctx.x.device());
  if (kind_ == Normalization::kLayerNorm) {
    Tensor db = grad_of(bias);
    ops::layernorm_backward(dx, dw, db, dy, ctx.x, gamma(dy.dtype(), dy.device()), ctx.mean,
                            ctx.rstd);
  } else {
    ops::rmsnorm_backward(dx, dw, dy, ctx.x, gamma(dy.dtype(), dy.device()), ctx.rstd);
  }
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
