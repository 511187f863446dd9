// f32/f64 dispatch for a device's kernels: fn.template operator()<T>() with T = float or double
// from the dtype of `t`, after checking that `t` lives on the device whose kernel is asking (a
// device's kernels only ever see its own tensors; ops.cpp has already checked that the op's
// tensors share one device).
#pragma once

#include "tensor/tensor.h"

namespace megatron {

template <typename Fn>
void dispatch_float_on(Device device, const Tensor& t, const char* op, Fn&& fn) {
  MEGATRON_CHECK(t.device() == device, op, ": the ", device_name(device),
                 " kernel got a tensor on ", device_name(t.device()));
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

}  // namespace megatron
