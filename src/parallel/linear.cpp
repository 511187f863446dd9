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

Fp8GemmScaling* Linear::enable_fp8(const Fp8Config& cfg, int tp_rank, int tp_size) {
  std::string name = weight.name.substr(0, weight.name.size() - std::string(".weight").size());
  fp8_ = std::make_unique<Fp8GemmScaling>(name, cfg, tp_rank, tp_size);
  // MXFP8 weights are gathered in bf16 and quantised on each rank, as Megatron does (TE cannot
  // cast master weights to MXFP8 shards); blockwise ones are codes with a scale per tile.
  if (cfg.param_gather && cfg.recipe != Fp8Recipe::kMxfp8) weight.fp8 = fp8_.get();
  return fp8_.get();
}

Tensor Linear::forward(const Tensor& x, Ctx& ctx) const {
  MEGATRON_CHECK(x.dim(-1) == in_, weight.name, ": input has ", x.dim(-1), " features, expected ",
                 in_);
  if (fp8_) return forward_fp8(x, ctx);
  const int64_t rows = x.numel() / in_;
  const DType wt = weight.value.dtype();
  keep_input(x, ctx);
  Tensor y = Tensor::empty({rows, out_}, wt == DType::kF64 ? DType::kF64 : DType::kF32, x.device());
  ops::matmul(y, ctx.x, false, weight.value, true);
  if (adds_bias()) ops::bias_add(y, bias.value_as(y.dtype()));
  return y;
}

void Linear::keep_input(const Tensor& x, Ctx& ctx) const {
  MEGATRON_CHECK(!fp8_, weight.name, ": an FP8 layer's input is not recomputed");
  const DType wt = weight.value.dtype();
  ctx.x = x.dtype() == wt || wt == DType::kF32 ? x : x.to(wt);
}

Tensor Linear::backward(const Tensor& dy, Ctx& ctx) const {
  if (fp8_) return backward_fp8(dy, ctx);
  const int64_t rows = dy.numel() / out_;
  const DType wt = weight.value.dtype();
  Tensor dy_c = is_half(wt) && dy.dtype() != wt ? dy.to(wt) : dy;
  Tensor dx =
      Tensor::empty({rows, in_}, is_half(dy.dtype()) ? DType::kF32 : dy.dtype(), dy.device());
  ops::matmul(dx, dy_c, false, weight.value, false);
  // A frozen weight without gradient storage (Param::requires_grad) skips its weight gradient.
  Tensor dw = weight.main_grad;
  if (dw.defined()) ops::matmul(dw, dy_c, true, ctx.x, false, weight.grad_beta());
  if (adds_bias() && bias.main_grad.defined()) {
    Tensor db = bias.main_grad;
    ops::bias_backward(db, dy);
  }
  ctx = Ctx{};  // activations are freed as soon as backward is done with them
  return dx;
}

namespace {
// The product of two inverse scales, applied to a GEMM's result of quantised operands (in f32, as
// the FP8 GEMM's epilogue does); block-scaled operands carry their factors (a product of 1: no
// pass over the result).
void descale(Tensor& result, const Fp8Tensor& a, const Fp8Tensor& b) {
  const float f = a.scale_inv * b.scale_inv;
  if (f != 1.0f) ops::scale_inplace(result, static_cast<double>(f));
}
}  // namespace

Tensor Linear::forward_fp8(const Tensor& x, Ctx& ctx) const {
  const int64_t rows = x.numel() / in_;
  ctx.x8 = fp8_->quantize(x, Fp8GemmScaling::kInput);
  ctx.w8 = fp8_->weight(weight);
  const DType wt = high_precision_dtype();
  if (!fp8_->config().wgrad) ctx.x = x.dtype() == wt || wt == DType::kF32 ? x : x.to(wt);
  // requires_grad, not main_grad: sharded-gradient runs attach main_grad in the backward only.
  if (fp8_->config().wgrad && fp8_->usages_differ() && fp8_->backward_follows() &&
      weight.requires_grad)
    ctx.x8c = fp8_->quantize(x, Fp8GemmScaling::kInput, Fp8Usage::kColumnwise);
  Tensor y =
      Tensor::empty({rows, out_}, x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32, x.device());
  ops::matmul(y, ctx.x8.q, false, ctx.w8.q, true);
  descale(y, ctx.x8, ctx.w8);
  // An FP8 primary weight is decoded again by the backward: only its codes stay in between.
  if (weight.fp8) ctx.w8.q = Tensor();
  // Block-scaled: the backward reads the columnwise copies only.
  if (fp8_->usages_differ()) ctx.x8 = ctx.w8 = Fp8Tensor{};
  if (adds_bias()) ops::bias_add(y, bias.value_as(y.dtype()));
  return y;
}

Tensor Linear::backward_fp8(const Tensor& dy, Ctx& ctx) const {
  const int64_t rows = dy.numel() / out_;
  const Fp8Tensor dy8 = fp8_->quantize(dy, Fp8GemmScaling::kGradOutput);
  const bool two_usages = fp8_->usages_differ();
  const Fp8Tensor w8 = two_usages           ? fp8_->weight_columnwise(weight)
                       : ctx.w8.q.defined() ? ctx.w8
                                            : fp8_->weight(weight);
  Tensor dx = Tensor::empty({rows, in_}, dy.dtype(), dy.device());
  ops::matmul(dx, dy8.q, false, w8.q, false);
  descale(dx, dy8, w8);
  Tensor dw = weight.main_grad;
  if (!dw.defined()) {
    // frozen without gradient storage: no weight gradient
  } else if (fp8_->config().wgrad) {
    // The descaled product is added to main_grad, as the FP8 GEMM's accumulate epilogue does.
    const Fp8Tensor dy8c =
        two_usages ? fp8_->quantize(dy, Fp8GemmScaling::kGradOutput, Fp8Usage::kColumnwise) : dy8;
    const Fp8Tensor& x8c = two_usages ? ctx.x8c : ctx.x8;
    MEGATRON_ASSERT(x8c.q.defined(), weight.name,
                    ": the forward kept no input for the weight gradient");
    Tensor partial = Tensor::empty(dw.shape(), dw.dtype(), dw.device());
    ops::matmul(partial, dy8c.q, true, x8c.q, false);
    descale(partial, dy8c, x8c);
    ops::add_inplace(dw, partial);
    weight.main_grad_zero = false;
  } else {
    const DType wt = high_precision_dtype();
    Tensor dy_c = is_half(wt) ? dy.to(wt) : dy;
    ops::matmul(dw, dy_c, true, ctx.x, false, weight.grad_beta());
  }
  if (adds_bias() && bias.main_grad.defined()) {
    Tensor db = bias.main_grad;
    ops::bias_backward(db, dy);
  }
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
