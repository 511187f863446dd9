// Skinny GEMM: C[m, n] (+)= A[m, k] B[n, k]^T for a few rows of A (kSkinnyRowsF32 / Bf16 in
// gemm.h), the shape of a linear layer's forward in token-by-token decoding (A: one row per
// sequence, B: the [out, in] weight). Not a general GEMM: other shapes go to oneDNN (matmul.cpp).
//
// Why its own kernel: with a handful of rows every weight is used m times, so the GEMM is a stream
// of the weights through memory and its speed is memory bandwidth. oneDNN's matmul at m = 1..6
// streams at well under half of that (a 1 x 50304 x 768 f32 GEMM, 154 MB of weights: oneDNN 15
// GFLOP/s, this kernel 27-35, on a 2-core Zen 4). Here each thread streams a contiguous range of
// weight rows once: a block of kRowsPerBlock rows stays in L1/L2 while every row of A is dotted
// with it, kInputsPerPass rows of A at a time.
//
// Arithmetic: f32 accumulation (bf16 products are exact in f32). f32 inputs, and bf16 on CPUs
// without AVX-512 BF16 (widened to f32 exactly): each dot product summed by FMAs in kLanes-wide
// partial sums, then the lanes, then the k % kLanes tail in order. bf16 with AVX-512 BF16:
// vdpbf16ps on pairs, then the lanes, then the tail. Every output element is computed by one thread
// in an order fixed by k alone: the same bits for any thread count and any split of n
// (column-parallel shards of a weight give the single process's bits).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "tensor/cpu/gemm.h"

namespace megatron::cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;  // one zmm register
#else
constexpr int kLanes = 8;  // one ymm register
#endif
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using Words = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));

constexpr int kRowsPerBlock = 4;   // weight rows streamed together
constexpr int kInputsPerPass = 4;  // rows of A dotted with a block at once (16 accumulators)

// kLanes weights of a row from p, widened to f32.
inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// bf16: the high half of an f32. With intrinsics because GCC splits __builtin_convertvector of 16
// lanes into two halves and a lane insert, which cost half the bf16 kernel's time (the masked
// form of the widening only avoids GCC 12's false "maybe uninitialized" on the unmasked one).
inline Vec load(const uint16_t* p) {
#if defined(__AVX512F__)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return std::bit_cast<Vec>(std::bit_cast<Words>(_mm512_maskz_cvtepu16_epi32(0xFFFF, h)) << 16);
#else
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return std::bit_cast<Vec>(std::bit_cast<Words>(_mm256_cvtepu16_epi32(h)) << 16);
#endif
}
inline float widen(float w) {
  return w;
}
inline float widen(uint16_t w) {
  return std::bit_cast<float>(static_cast<uint32_t>(w) << 16);
}

inline float sum_lanes(Vec v) {
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// c[i, j] (+)= x[i] . w[j] for MR rows of x (f32, row stride k) and NR rows of w (row stride ldb).
template <int MR, int NR, typename W>
void dot_block(const float* x, int64_t k, const W* w, int64_t ldb, float* c, int64_t ldc,
               bool accumulate) {
  Vec acc[MR][NR] = {};
  const int64_t body = k - k % kLanes;
  for (int64_t p = 0; p < body; p += kLanes) {
    Vec wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load(w + r * ldb + p);
    for (int i = 0; i < MR; ++i) {
      const Vec xv = load(x + i * k + p);
      for (int r = 0; r < NR; ++r) acc[i][r] += xv * wv[r];
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int r = 0; r < NR; ++r) {
      float s = sum_lanes(acc[i][r]);
      for (int64_t p = body; p < k; ++p) s += x[i * k + p] * widen(w[r * ldb + p]);
      float& out = c[i * ldc + r];
      out = accumulate ? out + s : s;
    }
  }
}

// x = the n bf16 values of a as f32.
[[maybe_unused]] void widen_rows(std::vector<float>& x, const uint16_t* a, int64_t n) {
  x.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = widen(a[i]);
}

#if defined(__AVX512BF16__)
// bf16 on CPUs with AVX-512 BF16: x stays bf16 and each instruction multiplies 32 pairs of bf16
// and adds them to 16 f32 lanes (vdpbf16ps: products exact, sums rounded to nearest even, with
// subnormals flushed), twice the weights per instruction of widening, no widening at all.
template <int MR, int NR>
void dot_block(const uint16_t* x, int64_t k, const uint16_t* w, int64_t ldb, float* c, int64_t ldc,
               bool accumulate) {
  constexpr int64_t kPairs = 32;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  const int64_t body = k - k % kPairs;
  for (int64_t p = 0; p < body; p += kPairs) {
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r)
      wv[r] = std::bit_cast<__m512bh>(_mm512_loadu_si512(w + r * ldb + p));
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = std::bit_cast<__m512bh>(_mm512_loadu_si512(x + i * k + p));
      for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv, wv[r]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int r = 0; r < NR; ++r) {
      float s = sum_lanes(std::bit_cast<Vec>(acc[i][r]));
      for (int64_t p = body; p < k; ++p) s += widen(x[i * k + p]) * widen(w[r * ldb + p]);
      float& out = c[i * ldc + r];
      out = accumulate ? out + s : s;
    }
  }
}
#endif

// Rows [0, m) of x against NR rows of w: kInputsPerPass rows of x at a time, then the rest.
template <int NR, typename X, typename W>
void rows_block(const X* x, int64_t m, int64_t k, const W* w, int64_t ldb, float* c, int64_t ldc,
                bool accumulate) {
  int64_t i = 0;
  for (; i + kInputsPerPass <= m; i += kInputsPerPass)
    dot_block<kInputsPerPass, NR>(x + i * k, k, w, ldb, c + i * ldc, ldc, accumulate);
  const int64_t rest = m - i;
  static_assert(kInputsPerPass == 4);
  if (rest == 3) dot_block<3, NR>(x + i * k, k, w, ldb, c + i * ldc, ldc, accumulate);
  if (rest == 2) dot_block<2, NR>(x + i * k, k, w, ldb, c + i * ldc, ldc, accumulate);
  if (rest == 1) dot_block<1, NR>(x + i * k, k, w, ldb, c + i * ldc, ldc, accumulate);
}

template <typename X, typename W>
void skinny(const GemmShape& s, const X* x, const W* w, float* c) {
  const int64_t blocks = (s.n + kRowsPerBlock - 1) / kRowsPerBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j = blk * kRowsPerBlock;
    const W* wj = w + j * s.ldb;
    float* cj = c + j;
    switch (std::min<int64_t>(kRowsPerBlock, s.n - j)) {
      case 4:
        rows_block<4>(x, s.m, s.k, wj, s.ldb, cj, s.ldc, s.accumulate);
        break;
      case 3:
        rows_block<3>(x, s.m, s.k, wj, s.ldb, cj, s.ldc, s.accumulate);
        break;
      case 2:
        rows_block<2>(x, s.m, s.k, wj, s.ldb, cj, s.ldc, s.accumulate);
        break;
      default:
        rows_block<1>(x, s.m, s.k, wj, s.ldb, cj, s.ldc, s.accumulate);
        break;
    }
  }
}

}  // namespace

bool skinny_gemm(const GemmShape& s, const void* a, const void* b, float* c) {
  static_assert(kRowsPerBlock == 4);
  const int64_t max_rows = s.dtype == DType::kF32    ? kSkinnyRowsF32
                           : s.dtype == DType::kBF16 ? kSkinnyRowsBf16
                                                     : 0;
  // A's rows packed (as ops::matmul passes them), B's rows at any stride.
  if (s.ta || !s.tb || s.lda != s.k || s.m > max_rows || s.m < 1 || s.n < 1 || s.k < 1)
    return false;
  if (s.dtype == DType::kF32) {
    skinny(s, static_cast<const float*>(a), static_cast<const float*>(b), c);
    return true;
  }
#if defined(__AVX512BF16__)
  skinny(s, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), c);
#else
  thread_local std::vector<float> x;  // A widened to f32, as dot_block reads it
  widen_rows(x, static_cast<const uint16_t*>(a), s.m * s.k);
  skinny(s, x.data(), static_cast<const uint16_t*>(b), c);
#endif
  return true;
}

}  // namespace megatron::cpu
