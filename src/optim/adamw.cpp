// AdamW step per parameter slice of the flat buffers (weight decay by parameter group), global
// gradient norm and Megatron's clipping rule.
#include "optim/adamw.h"

#include <cmath>

#include "optim/muon.h"
#include "tensor/ops.h"

namespace megatron {

AdamW::AdamW(ParamSet& params, const AdamWConfig& cfg)
    : params_(params),
      cfg_(cfg),
      // Moments for the trained part of the buffers only (frozen weights without gradients lie
      // after it and have none).
      // (Muon lays out its own: optim/muon.h.)
      exp_avg_(Tensor::zeros({cfg.states() >= 1 && !cfg.emerging() ? params.trainable_numel() : 0},
                             params.main().dtype(), params.main().device())),
      exp_avg_sq_(
          Tensor::zeros({cfg.states() >= 2 && !cfg.emerging() ? params.trainable_numel() : 0},
                        params.main().dtype(), params.main().device())) {
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
    Tensor w = p->main.view({n});
    // Mixed precision: the step writes the 16-bit compute copy as it goes.
    Tensor rounded = p->value.raw() != p->main.raw() ? p->value.view({n}) : Tensor();
    if (cfg_.sgd()) {
      Tensor buf = cfg_.states() >= 1 ? exp_avg_.flat_view(off, {n}) : Tensor();
      ops::sgd_step(w, buf, p->main_grad.view({n}),
                    sgd_spec(cfg_, rates, *p, step_, rates.grad_scale_of(*p, grad_scale)),
                    rounded.defined() ? &rounded : nullptr);
      continue;
    }
    Tensor m = exp_avg_.flat_view(off, {n}), v = exp_avg_sq_.flat_view(off, {n});
    ops::adamw_step(w, m, v, p->main_grad.view({n}),
                    adam_spec(cfg_, rates, *p, step_, rates.grad_scale_of(*p, grad_scale)),
                    rounded.defined() ? &rounded : nullptr);
  }
}

ops::AdamWSpec adam_spec(const AdamWConfig& cfg, const StepRates& rates, const Param& p,
                         int64_t step, double grad_scale) {
  ops::AdamWSpec spec;
  spec.lr = static_cast<float>(rates.lr_of(p));
  spec.beta1 = static_cast<float>(cfg.beta1);
  spec.beta2 = static_cast<float>(cfg.beta2);
  spec.eps = static_cast<float>(rates.eps_of(p, cfg.eps));
  spec.weight_decay = static_cast<float>(rates.decay_of(p));
  spec.step = step;
  spec.grad_scale = grad_scale;
  return spec;
}

const char* first_state_name(const AdamWConfig& cfg) {
  return cfg.sgd() ? "momentum_buffer" : "exp_avg";
}

const char* first_state_name(const AdamWConfig& cfg, const Param& p) {
  return cfg.rule == UpdateRule::kMuon && is_muon_matrix(p) ? "momentum_buffer"
                                                            : first_state_name(cfg);
}

std::string optimizer_state_family(const std::string& optimizer) {
  return optimizer == "sgd" || optimizer == "muon" || optimizer == "lion" ? optimizer : "adam";
}

int states_of(const AdamWConfig& cfg, const Param& p) {
  if (!cfg.emerging()) return cfg.states();
  if (is_muon_matrix(p)) return 1;  // Muon's buffer or Lion's moment
  return cfg.rule == UpdateRule::kMuon && cfg.muon_scalar_lion ? 1 : 2;
}

ops::LionSpec lion_spec(double beta1, double beta2, const StepRates& rates, const Param& p,
                        double grad_scale) {
  ops::LionSpec spec;
  spec.lr = static_cast<float>(rates.lr_of(p));
  spec.weight1 = static_cast<float>(1.0 - beta1);
  spec.weight2 = static_cast<float>(1.0 - beta2);
  spec.decay = static_cast<float>(-rates.decay_of(p) * rates.lr_of(p));
  spec.grad_scale = grad_scale;
  return spec;
}

ops::SgdSpec sgd_spec(const AdamWConfig& cfg, const StepRates& rates, const Param& p, int64_t step,
                      double grad_scale) {
  ops::SgdSpec spec;
  spec.lr = static_cast<float>(rates.lr_of(p));
  spec.momentum = static_cast<float>(cfg.sgd_momentum);
  spec.weight_decay = static_cast<float>(rates.decay_of(p));
  // The buffer's first step copies the gradient (FusedSGD's first_run). A buffer that starts at
  // zero later (a checkpoint saved with momentum 0, or without optimizer state, loaded) gives the
  // same: 0 x momentum + d is d.
  spec.first = step == 1;
  spec.grad_scale = grad_scale;
  return spec;
}

double grad_norm(ParamSet& params) {
  return std::sqrt(ops::sum_squares(params.grads()));
}

bool in_domain(const Param& p, ParamDomain only) {
  if (p.frozen) return false;  // not trained: in no norm or count
  return only == ParamDomain::kAll || p.expert_parallel == (only == ParamDomain::kExpert);
}

double grad_sum_squares_unique(ParamSet& params, ParamDomain only) {
  return grad_sum_squares_unique(params, only, NormGroup::kAll);
}

bool in_norm_group(const Param& p, NormGroup group) {
  return group == NormGroup::kAll || p.separate_norm == (group == NormGroup::kSeparate);
}

double grad_sum_squares_unique(ParamSet& params, ParamDomain only, NormGroup group) {
  double sum = 0;
  for (Param* p : params.params()) {
    if (!p->is_duplicate() && in_domain(*p, only) && in_norm_group(*p, group))
      sum += ops::sum_squares(p->main_grad);
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
