// Learning-rate schedule with Megatron's semantics (OptimizerParamScheduler).
//
// Counts samples, as Megatron does: each iteration advances by the global batch size, and warm-up
// and decay lengths are given in samples (iterations x global batch size). Linear warm-up from
// warmup_init to max_lr, then one of constant, linear, cosine, inverse-square-root or WSD
// (warmup-stable-decay) down to min_lr; after the decay length, min_lr.
#pragma once

#include <cstdint>
#include <string>

namespace megatron {

enum class LrDecayStyle : uint8_t { kConstant, kLinear, kCosine, kInverseSquareRoot, kWSD };
enum class WsdDecayStyle : uint8_t { kExponential, kLinear, kCosine, kMinusSqrt };
enum class WeightDecayIncrStyle : uint8_t { kConstant, kLinear, kCosine };

LrDecayStyle parse_lr_decay_style(const std::string& s);    // error names --lr-decay-style
WsdDecayStyle parse_wsd_decay_style(const std::string& s);  // error names --lr-wsd-decay-style
// error names --weight-decay-incr-style
WeightDecayIncrStyle parse_weight_decay_incr_style(const std::string& s);

struct LrSchedule {
  double max_lr = 0;          // --lr
  double min_lr = 0;          // --min-lr
  double warmup_init = 0;     // --lr-warmup-init
  double warmup_samples = 0;  // fractional with --lr-warmup-fraction, as in Megatron
  int64_t decay_samples = 0;
  int64_t wsd_decay_samples = 0;
  LrDecayStyle style = LrDecayStyle::kLinear;
  WsdDecayStyle wsd_style = WsdDecayStyle::kExponential;

  // Learning rate after `samples` training samples have been consumed.
  double lr_at(int64_t samples) const;
};

// Megatron's weight-decay increment (OptimizerParamScheduler.get_wd): from start to end over
// incr_samples, linearly or along a half cosine; end after that; constant: start == end.
struct WeightDecaySchedule {
  double start = 0;          // --start-weight-decay (--weight-decay when constant)
  double end = 0;            // --end-weight-decay
  int64_t incr_samples = 0;  // the training samples (train iterations x global batch)
  WeightDecayIncrStyle style = WeightDecayIncrStyle::kConstant;

  double wd_at(int64_t samples) const;
};

}  // namespace megatron
