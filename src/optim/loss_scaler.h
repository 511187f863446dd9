// LossScaler: fp16 loss scaling, Megatron's ConstantGradScaler and DynamicGradScaler.
//
// fp16 has 5 exponent bits: small gradients underflow to zero unless the loss, and with it every
// gradient, is multiplied by a large scale before backward; the fp32 main gradients are divided
// by it again before the optimizer step. With --loss-scale S the scale is constant. Otherwise it
// is dynamic: it starts at --initial-loss-scale (2^32); an iteration whose gradients hold an inf
// or NaN is skipped (on every rank: the caller all-reduces the verdict), and after --hysteresis
// such iterations (counted down, reset only when the scale grows) each further one halves the
// scale, never below --min-loss-scale; after --loss-scale-window consecutive clean iterations it
// doubles and the hysteresis count is restored. This is exactly DynamicGradScaler.update.
#pragma once

#include <cstdint>

namespace megatron {

struct LossScalerConfig {
  double loss_scale = 0;                     // --loss-scale: constant scale; 0: dynamic
  double initial_loss_scale = 4294967296.0;  // --initial-loss-scale (2^32)
  double min_loss_scale = 1.0;               // --min-loss-scale
  int64_t loss_scale_window = 1000;          // --loss-scale-window: clean iterations before growing
  int64_t hysteresis = 2;                    // --hysteresis: overflows tolerated before backing off
};

// What a checkpoint keeps of a scaler: its scale and both trackers.
struct LossScalerState {
  double scale = 1;
  int64_t growth_tracker = 0, hysteresis_tracker = 0;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // After an iteration: found_inf says whether its gradients overflowed (it was skipped).
  void update(bool found_inf);

  LossScalerState state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  // Restores a checkpoint's state (a constant scaler keeps its --loss-scale).
  void set_state(const LossScalerState& s);

 private:
  bool dynamic_;
  double scale_, min_scale_;
  int64_t window_, hysteresis_;
  int64_t growth_tracker_ = 0, hysteresis_tracker_;
};

}  // namespace megatron
