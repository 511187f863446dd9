#include "transformer/qk_clip.h"

#include <algorithm>
#include <cmath>

namespace megatron {

float QkClip::round(double x) const {
  const auto f = static_cast<float>(x);
  switch (dtype) {
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(f));
    case DType::kF16:
      return f16_to_f32(f32_to_f16(f));
    default:
      return f;
  }
}

bool QkClip::exceeds(float m) const {
  // torch compares a tensor with a Python number in the tensor's dtype.
  return m > round(threshold);
}

float QkClip::eta(float m) const {
  // Python's `threshold / tensor` is tensor.reciprocal() * threshold (torch's __rtruediv__): two
  // roundings, each in the tensor's dtype (computed in f32, the scalar not rounded first).
  const float reciprocal = round(1.0f / m);
  const float e = round(reciprocal * static_cast<float>(threshold));
  return std::min(e, 1.0f);  // clamp(max=1.0)
}

float QkClip::power(float eta, double e) const {
  // torch's pow with a scalar exponent casts the exponent to the tensor's dtype first, then
  // takes sqrt for 0.5 and the power (in f32) otherwise.
  const float x = round(e);
  if (x == 1.0f) return eta;
  if (x == 0.5f) return round(std::sqrt(eta));
  return round(std::pow(eta, x));
}

}  // namespace megatron
