// One GEMM on strided row-major buffers through oneDNN's cached primitives: the engine under
// ops::matmul and ops::grouped_matmul.
//
//   C[m, n] (+)= op(A) op(B),   A: [m, k] with row stride lda, or stored [k, m] when ta;
//                               B: [k, n] with row stride ldb, or stored [n, k] when tb;
//                               C: f32 [m, n] with row stride ldc.
//
// A and B are both f32, bf16 or f16 (16-bit products accumulate in f32). A primitive is planned
// for the threads the caller may use (omp_get_max_threads() at the call: inside a parallel loop
// whose body set it to 1, a single-threaded one) and cached per calling thread under its whole
// description, so a shape planned for one thread never serves a caller with more.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace megatron::cpu {

struct GemmShape {
  int64_t m, n, k;
  bool ta, tb;
  int64_t lda, ldb, ldc;
  DType dtype;      // of A and B
  bool accumulate;  // C += instead of C =
};

void gemm(const GemmShape& s, const void* a, const void* b, float* c);

}  // namespace megatron::cpu
