// The CUDA device's ops, one per op of tensor/ops.h with the same signature and contract (cuBLASLt
// GEMMs, the kernels of tensor/cuda/*.cu); reached only through the dispatch in tensor/ops.cpp.
// f32 and f64 (and bf16/f16 GEMM inputs and embedding tables); device memory.
#pragma once

#include "tensor/ops.h"

namespace megatron::cuda {

#include "tensor/device_ops.inc"  // IWYU pragma: export

}  // namespace megatron::cuda
