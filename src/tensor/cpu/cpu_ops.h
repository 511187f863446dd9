// The CPU device's kernels (oneDNN GEMMs, OpenMP loops), one per op of tensor/ops.h with the same
// signature and contract; reached only through the dispatch in tensor/ops.cpp. f32 and f64 (and
// bf16/f16 GEMM inputs); host memory.
#pragma once

#include "tensor/ops.h"

namespace megatron::cpu {

#include "tensor/device_ops.inc"  // IWYU pragma: export

// Fused kernels the CPU has (tensor/ops.h composes them from the ops above on other devices).
void bias_gelu_forward(Tensor& out, Tensor& y, const Tensor& bias, bool tanh_approx);
void adamw_step_scaled(Tensor& param, ops::StoredMoment exp_avg, ops::StoredMoment exp_avg_sq,
                       const Tensor& grad, const ops::AdamWSpec& spec, Tensor* rounded);

}  // namespace megatron::cpu
