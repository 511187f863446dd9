// Measured GEMM rates of this process: the denominator of model-FLOPs utilisation.
//
// Times a oneDNN GEMM (f32, or bf16 inputs with f32 accumulation) with the current thread count
// for about `seconds` and returns the best rate in GFLOP/s. The trainer measures a square one
// once at start-up; `megatron bench gemm` prints several sizes, or the shapes of a model's step.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "tensor/device.h"

namespace megatron {

// C[m, n] = op(A)[m, k] op(B)[k, n]; ta / tb: A / B stored transposed.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
};

// "MxNxK" or "MxNxK:XY", X and Y each N (as stored) or T (transposed) for A and B; Megatron's
// linear layers are NT forward, NN for the input gradient and TN for the weight gradient. Throws
// InvalidArgument naming the text otherwise.
GemmShape parse_gemm_shape(const std::string& text);
std::string gemm_shape_name(const GemmShape& s);

double measure_gemm_gflops(DType dtype, const GemmShape& shape, double seconds,
                           Device device = Device::kCPU);
// The square n x n x n NT GEMM.
double measure_gemm_gflops(DType dtype, int64_t n, double seconds, Device device = Device::kCPU);

}  // namespace megatron
