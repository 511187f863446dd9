// Constant and dynamic loss scaling with Megatron's update rule.
#include "optim/loss_scaler.h"

#include <algorithm>

#include "core/error.h"

namespace megatron {

LossScaler::LossScaler(const LossScalerConfig& cfg)
    : dynamic_(cfg.loss_scale <= 0),
      scale_(cfg.loss_scale > 0 ? cfg.loss_scale : cfg.initial_loss_scale),
      min_scale_(cfg.min_loss_scale),
      window_(cfg.loss_scale_window),
      hysteresis_(cfg.hysteresis),
      hysteresis_tracker_(cfg.hysteresis) {
  MEGATRON_CHECK(scale_ > 0, "--initial-loss-scale must be positive, got ", scale_);
  MEGATRON_CHECK(!dynamic_ || min_scale_ > 0, "--min-loss-scale must be positive, got ",
                 min_scale_);
  MEGATRON_CHECK(!dynamic_ || window_ > 0, "--loss-scale-window must be positive, got ", window_);
  MEGATRON_CHECK(!dynamic_ || hysteresis_ > 0, "--hysteresis must be positive, got ", hysteresis_);
}

void LossScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, min_scale_);
    return;
  }
  if (++growth_tracker_ == window_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ *= 2.0;
  }
}

void LossScaler::set_state(const LossScalerState& s) {
  if (!dynamic_) return;
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace megatron
