// Measured GEMM peak of this process: the denominator of model-FLOPs utilisation.
//
// Times a square oneDNN GEMM (f32, or bf16 inputs with f32 accumulation) with the current thread
// count for about `seconds` and returns the best rate in GFLOP/s. The trainer measures it once at
// start-up; `megatron bench gemm` prints it for several sizes.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace megatron {

double measure_gemm_gflops(DType dtype, int64_t n, double seconds);

}  // namespace megatron
