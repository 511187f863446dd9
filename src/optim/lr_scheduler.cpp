// Megatron's learning-rate formulas (OptimizerParamScheduler.get_lr), evaluated at a sample count.
#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace megatron {

LrDecayStyle parse_lr_decay_style(const std::string& s) {
  if (s == "constant") return LrDecayStyle::kConstant;
  if (s == "linear") return LrDecayStyle::kLinear;
  if (s == "cosine") return LrDecayStyle::kCosine;
  if (s == "inverse-square-root") return LrDecayStyle::kInverseSquareRoot;
  if (s == "WSD") return LrDecayStyle::kWSD;
  MEGATRON_CHECK(false, "--lr-decay-style: unknown style '", s,
                 "'; choose constant, linear, cosine, inverse-square-root or WSD");
  return LrDecayStyle::kLinear;
}

WsdDecayStyle parse_wsd_decay_style(const std::string& s) {
  if (s == "exponential") return WsdDecayStyle::kExponential;
  if (s == "linear") return WsdDecayStyle::kLinear;
  if (s == "cosine") return WsdDecayStyle::kCosine;
  if (s == "minus_sqrt") return WsdDecayStyle::kMinusSqrt;
  MEGATRON_CHECK(false, "--lr-wsd-decay-style: unknown style '", s,
                 "'; choose exponential, linear, cosine or minus_sqrt");
  return WsdDecayStyle::kExponential;
}

WeightDecayIncrStyle parse_weight_decay_incr_style(const std::string& s) {
  if (s == "constant") return WeightDecayIncrStyle::kConstant;
  if (s == "linear") return WeightDecayIncrStyle::kLinear;
  if (s == "cosine") return WeightDecayIncrStyle::kCosine;
  MEGATRON_CHECK(false, "--weight-decay-incr-style: unknown style '", s,
                 "'; choose constant, linear or cosine");
  return WeightDecayIncrStyle::kConstant;
}

double WeightDecaySchedule::wd_at(int64_t samples) const {
  if (samples > incr_samples || style == WeightDecayIncrStyle::kConstant) return end;
  const double ratio = static_cast<double>(samples) / static_cast<double>(incr_samples);
  const double coeff =
      style == WeightDecayIncrStyle::kLinear ? ratio : 0.5 * (std::cos(M_PI * (1 - ratio)) + 1.0);
  return start + coeff * (end - start);
}

double LrSchedule::lr_at(int64_t samples) const {
  const double n = static_cast<double>(samples);
  if (warmup_samples > 0 && n <= warmup_samples) {
    return warmup_init + (max_lr - warmup_init) * n / warmup_samples;
  }
  if (style == LrDecayStyle::kConstant) return max_lr;
  if (samples > decay_samples) return min_lr;
  if (style == LrDecayStyle::kInverseSquareRoot) {
    const double w = std::max(warmup_samples, 1.0);
    const double lr = max_lr * std::sqrt(w) / std::sqrt(std::max(n, 1.0));
    return std::max(min_lr, lr);
  }
  const double decay_ratio =
      (n - warmup_samples) / (static_cast<double>(decay_samples) - warmup_samples);
  double coeff = 1.0;
  switch (style) {
    case LrDecayStyle::kLinear:
      coeff = 1.0 - decay_ratio;
      break;
    case LrDecayStyle::kCosine:
      coeff = 0.5 * (std::cos(M_PI * decay_ratio) + 1.0);
      break;
    case LrDecayStyle::kWSD: {
      const int64_t anneal_start = decay_samples - wsd_decay_samples;
      if (samples <= anneal_start) {
        coeff = 1.0;
      } else {
        const double r =
            (n - static_cast<double>(anneal_start)) / static_cast<double>(wsd_decay_samples);
        switch (wsd_style) {
          case WsdDecayStyle::kLinear:
            coeff = 1.0 - r;
            break;
          case WsdDecayStyle::kCosine:
            coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
            break;
          case WsdDecayStyle::kExponential:
            coeff = 2.0 * std::pow(0.5, r) - 1.0;
            break;
          case WsdDecayStyle::kMinusSqrt:
            coeff = 1.0 - std::sqrt(r);
            break;
        }
      }
      break;
    }
    default:
      break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace megatron
