// Linear forward/backward on oneDNN GEMMs; bf16 runs round the GEMM inputs to bf16.
#include "parallel/linear.h"

#include "tensor/ops.h"

namespace megatron {

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool with_bias, double init_std)
    : in_(in), out_(out) {
  weight.name = name + ".weight";
  weight.shape = {out, in};
  weight.init_std = init_std;
  if (with_bias) {
    bias.name = name + ".bias";
    bias.shape = {out};
    bias.init = Init::kZeros;
    bias.no_weight_decay = true;
  }
}

void Linear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias()) out.push_back(&bias);
}

Tensor Linear::forward(const Tensor& x, Ctx& ctx) const {
  MEGATRON_CHECK(x.dim(-1) == in_, weight.name, ": input has ", x.dim(-1), " features, expected ",
                 in_);
  const int64_t rows = x.numel() / in_;
  const DType wt = weight.value.dtype();
  ctx.x = x.dtype() == wt || wt == DType::kF32 ? x : x.to(wt);
  Tensor y = Tensor::empty({rows, out_}, wt == DType::kF64 ? DType::kF64 : DType::kF32, x.device());
  ops::matmul(y, ctx.x, false, weight.value, true);
  if (has_bias()) ops::bias_add(y, bias.value_as(y.dtype()));
  return y;
}

Tensor Linear::backward(const Tensor& dy, Ctx& ctx) const {
  const int64_t rows = dy.numel() / out_;
  const DType wt = weight.value.dtype();
  Tensor dy_c = is_half(wt) ? dy.to(wt) : dy;
  Tensor dx = Tensor::empty({rows, in_}, dy.dtype(), dy.device());
  ops::matmul(dx, dy_c, false, weight.value, false);
  Tensor dw = weight.main_grad;
  ops::matmul(dw, dy_c, true, ctx.x, false, 1.0f);
  if (has_bias()) {
    Tensor db = bias.main_grad;
    ops::bias_backward(db, dy);
  }
  ctx = Ctx{};  // activations are freed as soon as backward is done with them
  return dx;
}

}  // namespace megatron
