// exp, erf and tanh that the compiler can vectorise.
//
// glibc's vector math (libmvec) is only declared to GCC under -ffast-math, which we do not use, so
// std::exp in an `omp simd` loop stays a scalar call: 4 ns per element, most of the softmax
// cross-entropy over a 50k vocabulary. These are plain arithmetic on floats and integer bits,
// which GCC turns into AVX-512 code. Accuracy: exp within 2 ulp of the correctly rounded value
// on [-87, 88] (flushes to ~1e-38 below, saturates above); erf within 1.2e-7 absolute (the
// Numerical Recipes erfc fit, Chebyshev-derived). The double overloads forward to the standard
// library: the f64 path is the one finite differences test, and stays exact.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace megatron::cpu {

inline float vexp(float x) {
  // Clamp with comparisons, not std::fmin/fmax (GCC does not vectorise those); NaN passes through.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float t = x * 1.4426950408889634f;  // x / ln 2
  // Round to nearest integer with the 1.5 * 2^23 trick (vectorises; no lrint call).
  const float fi = (t + 12582912.0f) - 12582912.0f;
  // exp(x) = 2^fi * exp(r), r = x - fi ln2 in [-0.347, 0.347], ln2 split for accuracy.
  const float r = (x - fi * 0.693145751953125f) - fi * 1.428606765330187e-06f;
  // Taylor series of exp(r) to degree 7: truncation error < 2e-8 relative on that range.
  float p = 1.9841269841269841e-4f;
  p = p * r + 1.3888888888888889e-3f;
  p = p * r + 8.3333333333333333e-3f;
  p = p * r + 4.1666666666666667e-2f;
  p = p * r + 1.6666666666666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = (static_cast<int32_t>(fi) + 127) << 23;
  return p * std::bit_cast<float>(e);
}

inline double vexp(double x) {
  return std::exp(x);
}

inline float verf(float x) {
  // erf(x) = 1 - erfc(|x|) sign-adjusted; erfc(z) = t exp(-z^2 + poly(t)), t = 1 / (1 + z / 2).
  const float z = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float erfc = t * vexp(-z * z + p);
  const float r = 1.0f - erfc;
  return x < 0 ? -r : r;
}

inline double verf(double x) {
  return std::erf(x);
}

// tanh(u) = 1 - 2 / (exp(2u) + 1): saturates cleanly to +-1; absolute error ~2e-7 near 0.
inline float vtanh(float u) {
  return 1.0f - 2.0f / (vexp(2.0f * u) + 1.0f);
}

inline double vtanh(double u) {
  return std::tanh(u);
}

}  // namespace megatron::cpu
