// GELU and its derivative, exact (erf) and tanh-approximated, as inline functions of one element:
// the one place their expressions are written, so the plain ops and the fused bias + GELU give
// the same bits. Vectorised where called inside `omp simd` loops.
#pragma once

#include <cmath>

#include "tensor/cpu/vec_math.h"

namespace megatron::cpu {

inline constexpr double kSqrt2OverPi = 0.7978845608028654;
inline constexpr double kInvSqrt2 = 0.7071067811865476;
inline constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <bool Tanh, typename T>
inline T gelu_of(T v) {
  if constexpr (Tanh) {
    T inner = static_cast<T>(kSqrt2OverPi) * (v + static_cast<T>(0.044715) * v * v * v);
    return static_cast<T>(0.5) * v * (static_cast<T>(1) + vtanh(inner));
  } else {
    return static_cast<T>(0.5) * v * (static_cast<T>(1) + verf(v * static_cast<T>(kInvSqrt2)));
  }
}

// d gelu / dv. Each is a sum of two products, a b + c d, which the compiler may contract into
// fma(a, b, c d) or fma(c, d, a b): two roundings of the same sum, and GCC picked one in vectorised
// loops and the other in their scalar remainders, so an element's gradient depended on where the
// thread's share of the elements put it (the thread count, the row length). The fma is written
// out: one rounding everywhere.
template <bool Tanh, typename T>
inline T gelu_grad_of(T v) {
  if constexpr (Tanh) {
    T inner = static_cast<T>(kSqrt2OverPi) * (v + static_cast<T>(0.044715) * v * v * v);
    T t = vtanh(inner);
    T dinner = static_cast<T>(kSqrt2OverPi) * (1 + static_cast<T>(3 * 0.044715) * v * v);
    return std::fma(static_cast<T>(0.5) * v * (1 - t * t), dinner, static_cast<T>(0.5) * (1 + t));
  } else {
    T cdf = static_cast<T>(0.5) * (1 + verf(v * static_cast<T>(kInvSqrt2)));
    T pdf = static_cast<T>(kInvSqrt2Pi) * vexp(static_cast<T>(-0.5) * v * v);
    return std::fma(v, pdf, cdf);
  }
}

}  // namespace megatron::cpu
