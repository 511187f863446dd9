// The two 8-bit floating-point formats of FP8 training, as the OCP 8-bit floating point
// specification defines them (CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2, Transformer Engine's
// kFloat8E4M3 / kFloat8E5M2):
//
//             sign exp man  bias  max finite   min normal  min subnormal  inf        NaN
//   E4M3        1   4   3     7   448 (0x7E)   2^-6        2^-9           none       S.1111.111
//   E5M2        1   5   2    15   57344 (0x7B) 2^-14       2^-16          S.11111.00 S.11111.xx
//
// Conversion from f32 is the one Transformer Engine's casts use: round to nearest, ties to even,
// saturating (__NV_SATFINITE): a finite value beyond the largest finite code, and +-inf, become
// +-max finite; NaN stays NaN. These are codecs only; the scaling that maps a tensor into the
// format's range is parallel/fp8_scaling.h's.
//
// Every FP8 value is exact in bf16 (at most 3 mantissa bits, exponents 2^-16 .. 2^15), so the CPU
// keeps quantised tensors as bf16 holding FP8 values and multiplies them with its bf16 GEMM: the
// products and f32 sums of an FP8 GEMM, without a byte format of its own.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace megatron {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

const char* fp8_format_name(Fp8Format f);  // "e4m3", "e5m2"
float fp8_max(Fp8Format f);                // 448, 57344

// The code of x (RNE, saturating; NaN -> 0x7F with x's sign).
uint8_t fp8_encode(float x, Fp8Format f);
// The value of a code (E4M3 has no infinities; NaN codes give NaN).
float fp8_decode(uint8_t code, Fp8Format f);
// fp8_decode(fp8_encode(x)) without the code: what the quantisation kernels use (inline, so
// that their loops vectorise). Normal results round the f32 mantissa to the format's width in
// place (half an ulp added, ties to even, then masked); subnormal ones are rounded to multiples
// of the subnormal spacing by adding and subtracting a power of two whose f32 ulp is that spacing
// (IEEE round-to-nearest-even does the rounding; the build never enables -ffast-math).
inline float fp8_round(float x, Fp8Format f) {
  if (std::isnan(x)) return x;
  const bool e4m3 = f == Fp8Format::kE4M3;
  const int drop = e4m3 ? 20 : 21;  // f32 mantissa bits beyond the format's 3 or 2
  const float max_finite = e4m3 ? 448.0f : 57344.0f;
  const float min_normal = e4m3 ? 0x1p-6f : 0x1p-14f;
  const float magic = e4m3 ? 0x1p14f : 0x1p7f;  // ulp 2^-9 or 2^-16: the subnormal spacing
  const float a = std::fabs(x);
  float r;
  if (a < min_normal) {
    r = (a + magic) - magic;
  } else {
    uint32_t u;
    std::memcpy(&u, &a, 4);
    u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1u);
    u &= ~((1u << drop) - 1);
    std::memcpy(&r, &u, 4);  // +inf when a was inf or rounded past FLT_MAX
  }
  return std::copysign(std::fmin(r, max_finite), x);  // saturating
}

// The code of r, an FP8 value (what fp8_round returns) or NaN: fp8_encode's code for a value
// that needs no rounding, by bit arithmetic only, so that encoding loops vectorise. The result
// for any other r is unspecified.
inline uint8_t fp8_code_of(float r, Fp8Format f) {
  uint32_t u;
  std::memcpy(&u, &r, 4);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(r)) return sign | 0x7F;
  const bool e4m3 = f == Fp8Format::kE4M3;
  const int man = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const float a = std::fabs(r);
  if (a < (e4m3 ? 0x1p-6f : 0x1p-14f))  // zero or subnormal: a multiple of the spacing
    return sign | static_cast<uint8_t>(a * (e4m3 ? 0x1p9f : 0x1p16f));
  const uint32_t exponent = ((u >> 23) & 0xFFu) - 127u + static_cast<uint32_t>(bias);
  const uint32_t mantissa = (u >> (23 - man)) & ((1u << man) - 1u);
  return sign | static_cast<uint8_t>((exponent << man) | mantissa);
}

// fp8_code_of(fp8_round(x, kE4M3), kE4M3) with selects instead of branches, so that GCC
// vectorises the loops around it (fp8_round's early NaN return keeps them scalar): the mantissa
// rounded to 3 bits in the f32 bits (ties to even) for normal results, saturated at 448 (code
// 0x7E; infinities too), subnormal ones rounded to multiples of 2^-9 by IEEE addition; NaN gives
// 0x7F with x's sign.
inline uint8_t e4m3_code(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 24) & 0x80u, au = u & 0x7FFFFFFFu;
  float a;
  std::memcpy(&a, &au, 4);
  uint32_t rounded = au + 0x7FFFFu + ((au >> 20) & 1u);
  rounded &= ~0xFFFFFu;
  const uint32_t normal = rounded >= 0x43E00000u  // 448.0f: the largest finite E4M3
                              ? 0x7Eu
                              : (((rounded >> 23) - 120u) << 3) | ((rounded >> 20) & 7u);
  // (Only a subnormal result is converted to an integer: NaN and infinities would be undefined.)
  const float small = a < 0x1p-6f ? a : 0.0f;
  const auto subnormal = static_cast<uint32_t>(((small + 0x1p14f) - 0x1p14f) * 0x1p9f);
  uint32_t code = a < 0x1p-6f ? subnormal : normal;
  code = au > 0x7F800000u ? 0x7Fu : code;
  return static_cast<uint8_t>(sign | code);
}

// fp8_decode of every code, [256] (for decoding loops).
const float* fp8_decode_table(Fp8Format f);

}  // namespace megatron
