// Helpers shared by the CPU kernels: row views and f32/f64 dispatch.
#pragma once

#include "tensor/tensor.h"

namespace megatron::cpu {

// Number of rows when the last dim is the row length.
inline int64_t rows_of(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1);
}

// Calls fn.template operator()<T>() with T = float or double from the dtype of `t`.
template <typename Fn>
void dispatch_float(const Tensor& t, const char* op, Fn&& fn) {
  // Only CPU storage reaches a CPU kernel; another device's ops are its own implementation.
  MEGATRON_CHECK(t.device() == Device::kCPU, op, ": the CPU kernel got a tensor on ",
                 device_name(t.device()));
  switch (t.dtype()) {
    case DType::kF32:
      fn.template operator()<float>();
      break;
    case DType::kF64:
      fn.template operator()<double>();
      break;
    default:
      MEGATRON_CHECK(false, op, ": expected an f32 or f64 tensor, got ", dtype_name(t.dtype()));
  }
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  MEGATRON_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", dtype_name(a.dtype()), " vs ",
                 dtype_name(b.dtype()));
}

inline void check_numel(const Tensor& a, const Tensor& b, const char* op) {
  MEGATRON_CHECK(a.numel() == b.numel(), op, ": size mismatch, ", a.str(), " vs ", b.str());
}

}  // namespace megatron::cpu
