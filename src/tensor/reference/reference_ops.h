// The reference device: every op of tensor/ops.h computed by the naive fp64 formulas of
// tensor/reference/reference.h (single-threaded, no tiling, the formula as printed), with the
// same signature and contract as the op. Floating tensors on this device are f64; ids, targets
// and masks keep their dtypes. A test device: what the op harness compares every other device
// with, through the same ops.h calls.
#pragma once

#include "tensor/ops.h"

namespace megatron::reference {

#include "tensor/device_ops.inc"  // IWYU pragma: export

}  // namespace megatron::reference
