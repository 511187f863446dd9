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

// The few-rows GEMM of token-by-token decoding (skinny_gemm.cpp): C (+)= A B^T with A [m, k] not
// transposed, B stored [n, k], f32 with m <= kSkinnyRowsF32 or bf16 with m <= kSkinnyRowsBf16.
// Returns false, doing nothing, for any other shape or dtype. The bounds are where oneDNN's
// matmul catches up (measured on Zen 4 with bench_ops' BM_DecodeStepGemms, docs/PERFORMANCE.md):
// in f32 at about 8 rows; in bf16 at 8 rows where the kernel must widen bf16 to f32, at 16 where
// it has the AVX-512 BF16 dot products too.
inline constexpr int64_t kSkinnyRowsF32 = 6;
#if defined(__AVX512BF16__)
inline constexpr int64_t kSkinnyRowsBf16 = 16;
#else
inline constexpr int64_t kSkinnyRowsBf16 = 6;
#endif
bool skinny_gemm(const GemmShape& s, const void* a, const void* b, float* c);

}  // namespace megatron::cpu
