// AdamW step per parameter slice of the flat buffers (weight decay by parameter group), global
// gradient norm and Megatron's clipping rule.
#include "optim/adamw.h"

#include <cmath>

#include "tensor/ops.h"

namespace megatron {

AdamW::AdamW(ParamSet& params, const AdamWConfig& cfg)
    : params_(params),
      cfg_(cfg),
      // Moments for the trained part of the buffers only (frozen weights without gradients lie
      // after it and have none).
      exp_avg_(
          Tensor::zeros({params.trainable_numel()}, params.main().dtype(), params.main().device())),
      exp_avg_sq_(Tensor::zeros({params.trainable_numel()}, params.main().dtype(),
                                params.main().device())) {
  MEGATRON_CHECK(
      cfg.exp_avg_dtype == MomentDType::kF32 && cfg.exp_avg_sq_dtype == MomentDType::kF32,
      "Adam moments in lower precision are the distributed optimizer's "
      "(--use-precision-aware-optimizer only supported with distributed optimizer)");
}

void AdamW::step(const StepRates& rates, double grad_scale) {
  ++step_;
  for (Param* p : params_.params()) {
    if (!p->requires_grad) {
      // No gradient, no moments; the compute copy still follows main (a router's expert bias is
      // updated outside the optimizer).
      if (p->value.raw() != p->main.raw()) p->value.copy_from(p->main);
      continue;
    }
    const int64_t off = params_.offset_of(*p);
    const int64_t n = p->main.numel();
    Tensor m = exp_avg_.flat_view(off, {n}), v = exp_avg_sq_.flat_view(off, {n});
    Tensor w = p->main.view({n});
    ops::AdamWSpec spec;
    spec.lr = static_cast<float>(rates.lr_of(*p));
    spec.beta1 = static_cast<float>(cfg_.beta1);
    spec.beta2 = static_cast<float>(cfg_.beta2);
    spec.eps = static_cast<float>(cfg_.eps);
    spec.weight_decay = static_cast<float>(rates.decay_of(*p));
    spec.step = step_;
    spec.grad_scale = grad_scale;
    // Mixed precision: the step writes the 16-bit compute copy as it goes.
    Tensor rounded = p->value.raw() != p->main.raw() ? p->value.view({n}) : Tensor();
    ops::adamw_step(w, m, v, p->main_grad.view({n}), spec, rounded.defined() ? &rounded : nullptr);
  }
}

double grad_norm(ParamSet& params) {
  return std::sqrt(ops::sum_squares(params.grads()));
}

bool in_domain(const Param& p, ParamDomain only) {
  if (p.frozen) return false;  // not trained: in no norm or count
  return only == ParamDomain::kAll || p.expert_parallel == (only == ParamDomain::kExpert);
}

double grad_sum_squares_unique(ParamSet& params, ParamDomain only) {
  double sum = 0;
  for (Param* p : params.params()) {
    if (!p->is_duplicate() && in_domain(*p, only)) sum += ops::sum_squares(p->main_grad);
  }
  return sum;
}

int64_t grad_zeros_unique(ParamSet& params, ParamDomain only) {
  int64_t zeros = 0;
  for (Param* p : params.params()) {
    if (!p->is_duplicate() && in_domain(*p, only)) zeros += ops::count_zeros(p->main_grad);
  }
  return zeros;
}

double params_sum_squares_unique(ParamSet& params, ParamDomain only) {
  double sum = 0;
  for (Param* p : params.params()) {
    if (!p->is_duplicate() && in_domain(*p, only)) sum += ops::sum_squares(p->main);
  }
  return sum;
}

double clip_coefficient(double max_norm, double norm) {
  if (max_norm <= 0) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  return coeff < 1.0 ? coeff : 1.0;
}

void clip_grads(ParamSet& params, double max_norm, double norm) {
  const double coeff = clip_coefficient(max_norm, norm);
  if (coeff < 1.0) ops::scale_inplace(params.grads(), coeff);
}

}  // namespace megatron
