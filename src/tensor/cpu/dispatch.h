// Helpers shared by the CPU kernels: row views and f32/f64 dispatch.
#pragma once

#include <utility>

#include "tensor/dtype_dispatch.h"
#include "tensor/tensor.h"

namespace megatron::cpu {

// Number of rows when the last dim is the row length.
inline int64_t rows_of(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1);
}

// Calls fn.template operator()<T>() with T = float or double from the dtype of `t` (a CPU
// tensor).
template <typename Fn>
void dispatch_float(const Tensor& t, const char* op, Fn&& fn) {
  dispatch_float_on(Device::kCPU, t, op, std::forward<Fn>(fn));
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  MEGATRON_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", dtype_name(a.dtype()), " vs ",
                 dtype_name(b.dtype()));
}

inline void check_numel(const Tensor& a, const Tensor& b, const char* op) {
  MEGATRON_CHECK(a.numel() == b.numel(), op, ": size mismatch, ", a.str(), " vs ", b.str());
}

}  // namespace megatron::cpu
