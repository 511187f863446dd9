// bf16 tile products for the attention kernels of bf16 runs, on AVX-512 BF16 (vdpbf16ps).
//
// Megatron's attention on bf16 activations multiplies bf16 tiles and accumulates in f32 (the
// flash kernels round q, k, v, the probabilities and dS to bf16). Here the f32 tiles the kernels
// build are rounded to bf16 (nearest even) as they are packed, and multiplied two products per
// f32 lane per instruction: twice the f32 FMA rate on the same units.
//
// Layouts, all of 32-bit words that hold two bf16 values (the lower index in the low half):
//   rows:  A[m, k] row-major, word (r, p) = (A[r, 2p], A[r, 2p + 1]); k padded to even with 0.
//   pairs: B[k, n] "VNNI", word (p, j) = (B[2p, j], B[2p + 1, j]) at p * n + j.
// tile_gemm_bf16 computes C[m, n] += A B in f32 from A in rows or in pairs layout (the pairs
// layout of a stored [k, m] matrix is the rows layout of its transpose: A^T B without a
// transpose) and B in pairs layout. Each C element sums its k / 2 pair products in order, so the
// result does not depend on m, n or the thread count. n must be a multiple of 16. vdpbf16ps
// rounds each step's sum to nearest even (the bf16 products are exact in f32) and treats
// subnormal inputs and results as zero, whatever MXCSR says.
#pragma once

#include <cstdint>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace megatron::cpu {

#if defined(__AVX512BF16__)
inline constexpr bool kBf16Tiles = true;

namespace bf16_tile_detail {

inline __m512bh as_bh(__m512i x) {
  return (__m512bh)x;
}

// Rows [0, R) of C: 32 columns (two registers) at a time, 16 at the end.
template <int R, bool kPairsA>
inline void rows(float* __restrict c, int64_t ldc, const uint32_t* __restrict a, int64_t lda,
                 const uint32_t* __restrict b, int64_t n, int64_t kp) {
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const bool two = j0 + 32 <= n;
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm512_loadu_ps(c + r * ldc + j0);
      acc[r][1] = two ? _mm512_loadu_ps(c + r * ldc + j0 + 16) : _mm512_setzero_ps();
    }
    if (two) {
      for (int64_t p = 0; p < kp; ++p) {
        const __m512bh b0 = as_bh(_mm512_loadu_si512(b + p * n + j0));
        const __m512bh b1 = as_bh(_mm512_loadu_si512(b + p * n + j0 + 16));
        for (int r = 0; r < R; ++r) {
          const uint32_t w = kPairsA ? a[p * lda + r] : a[r * lda + p];
          const __m512bh av = as_bh(_mm512_set1_epi32(static_cast<int>(w)));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
      }
    } else {
      for (int64_t p = 0; p < kp; ++p) {
        const __m512bh b0 = as_bh(_mm512_loadu_si512(b + p * n + j0));
        for (int r = 0; r < R; ++r) {
          const uint32_t w = kPairsA ? a[p * lda + r] : a[r * lda + p];
          acc[r][0] =
              _mm512_dpbf16_ps(acc[r][0], as_bh(_mm512_set1_epi32(static_cast<int>(w))), b0);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(c + r * ldc + j0, acc[r][0]);
      if (two) _mm512_storeu_ps(c + r * ldc + j0 + 16, acc[r][1]);
    }
  }
}

// The last `rest` (< kRows) rows: rows<R> for R == rest.
template <int R, bool kPairsA>
inline void tail(int64_t rest, float* c, int64_t ldc, const uint32_t* a, int64_t lda,
                 const uint32_t* b, int64_t n, int64_t kp) {
  if constexpr (R > 0) {
    if (rest == R) {
      rows<R, kPairsA>(c, ldc, a, lda, b, n, kp);
      return;
    }
    tail<R - 1, kPairsA>(rest, c, ldc, a, lda, b, n, kp);
  }
}

template <bool kPairsA>
inline void gemm(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b,
                 int64_t m, int64_t n, int64_t kp) {
  constexpr int kRows = 8;  // 16 accumulators of AVX-512's 32 registers
  // Row i of A: a + i * lda in rows layout, a + i (column i of every pair row) in pairs layout.
  const int64_t step = kPairsA ? 1 : lda;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows)
    rows<kRows, kPairsA>(c + i * ldc, ldc, a + i * step, lda, b, n, kp);
  if (i < m) tail<kRows - 1, kPairsA>(m - i, c + i * ldc, ldc, a + i * step, lda, b, n, kp);
}

}  // namespace bf16_tile_detail

// A[m, k] (f32, leading dimension lds) into rows layout with `ldd` words per row; k rounded up to
// even, the pad 0.
inline void pack_rows_bf16(uint32_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t m,
                           int64_t k) {
  const int64_t kp = (k + 1) / 2 * 2;
  for (int64_t r = 0; r < m; ++r) {
    const float* s = src + r * lds;
    auto* d = reinterpret_cast<uint16_t*>(dst + r * ldd);
    for (int64_t c0 = 0; c0 < kp; c0 += 16) {
      const int64_t have = k - c0 < 16 ? k - c0 : 16, put = kp - c0 < 16 ? kp - c0 : 16;
      const __m512 x = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << have) - 1), s + c0);
      const __m256i y = (__m256i)_mm512_cvtneps_pbh(x);
      _mm256_mask_storeu_epi16(d + c0, static_cast<__mmask16>((1u << put) - 1), y);
    }
  }
}

// B[k, n] (f32, leading dimension lds; n a multiple of 16) into pairs layout [(k + 1) / 2, n];
// an odd k's last pair has 0 in its high half.
inline void pack_pairs_bf16(uint32_t* dst, const float* src, int64_t lds, int64_t k, int64_t n) {
  // Interleaves the 16 bf16 of row 2p (low 256 bits) with the 16 of row 2p + 1 (high 256 bits).
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  for (int64_t p = 0; p < (k + 1) / 2; ++p) {
    const float* lo = src + 2 * p * lds;
    const float* hi = 2 * p + 1 < k ? lo + lds : nullptr;
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
      const __m512 x0 = _mm512_loadu_ps(lo + j0);
      const __m512 x1 = hi ? _mm512_loadu_ps(hi + j0) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
      _mm512_storeu_si512(dst + p * n + j0, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// C[m, n] += A B, A in rows layout (kPairsA false: word (r, p) at a[r * lda + p]) or pairs layout
// (true: at a[p * lda + r]), B in pairs layout [kp, n]; kp pair rows.
template <bool kPairsA>
inline void tile_gemm_bf16(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b,
                           int64_t m, int64_t n, int64_t kp) {
  bf16_tile_detail::gemm<kPairsA>(c, ldc, a, lda, b, m, n, kp);
}

#else
// Without AVX-512 BF16 the attention kernels keep their f32 tiles; the declarations let their
// bf16 branches (discarded by `if constexpr (kBf16Tiles)`) compile.
inline constexpr bool kBf16Tiles = false;
void pack_rows_bf16(uint32_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t m,
                    int64_t k);
void pack_pairs_bf16(uint32_t* dst, const float* src, int64_t lds, int64_t k, int64_t n);
template <bool kPairsA>
void tile_gemm_bf16(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b,
                    int64_t m, int64_t n, int64_t kp);
#endif

}  // namespace megatron::cpu
