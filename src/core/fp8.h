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

#include <bit>
#include <cmath>
#include <cstdint>

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
  const bool e4m3 = f == Fp8Format::kE4M3;
  const int drop = e4m3 ? 20 : 21;  // f32 mantissa bits beyond the format's 3 or 2
  const float max_finite = e4m3 ? 448.0f : 57344.0f;
  const float min_normal = e4m3 ? 0x1p-6f : 0x1p-14f;
  const float magic = e4m3 ? 0x1p14f : 0x1p7f;  // ulp 2^-9 or 2^-16: the subnormal spacing
  // Both roundings, then a select (no branch, so that loops vectorise).
  const float a = std::fabs(x);
  uint32_t u = std::bit_cast<uint32_t>(a);
  u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1u);
  u &= ~((1u << drop) - 1);
  const float normal = std::bit_cast<float>(u);  // +inf when a was inf or rounded past FLT_MAX
  const float small = a < min_normal ? a : 0.0f;
  const float subnormal = (small + magic) - magic;
  const float rounded = a < min_normal ? subnormal : normal;
  // Saturating (a compare, not fminf, which does not vectorise; NaN is handled below).
  const float r = std::copysign(rounded < max_finite ? rounded : max_finite, x);
  return std::isnan(x) ? x : r;  // NaN stays NaN
}

// The code of r, an FP8 value (what fp8_round returns) or NaN: fp8_encode's code for a value
// that needs no rounding, by bit arithmetic and selects only, so that encoding loops vectorise.
// The result for any other r is unspecified.
inline uint8_t fp8_code_of(float r, Fp8Format f) {
  const uint32_t u = std::bit_cast<uint32_t>(r);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const bool e4m3 = f == Fp8Format::kE4M3;
  const int man = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const float a = std::fabs(r);
  // Zero or subnormal: a multiple of the spacing (only such values are converted to an integer:
  // NaN would be undefined).
  const bool subnormal = a < (e4m3 ? 0x1p-6f : 0x1p-14f);
  const float small = subnormal ? a : 0.0f;
  const auto sub_code = static_cast<uint32_t>(small * (e4m3 ? 0x1p9f : 0x1p16f));
  const uint32_t exponent = ((u >> 23) & 0xFFu) - 127u + static_cast<uint32_t>(bias);
  const uint32_t mantissa = (u >> (23 - man)) & ((1u << man) - 1u);
  const uint32_t code = subnormal ? sub_code : (exponent << man) | mantissa;
  return std::isnan(r) ? static_cast<uint8_t>(sign | 0x7F) : static_cast<uint8_t>(sign | code);
}

// fp8_decode of every code, [256] (for decoding loops).
const float* fp8_decode_table(Fp8Format f);

// ---- Block scaling (--fp8-recipe mxfp8 / blockwise) -------------------------------------------
// A block of a tensor is quantised as q = fp8_round(x * scale) and stands for q * scale_inv; both
// factors are powers of two (or 0 / 1 at the edges below), so q * scale_inv is exact in f32 and
// in bf16.
//   kMxfp8 (Transformer Engine's MXFP8BlockScaling): blocks of 32 along the GEMM's reduction
//     dimension; an E8M0 exponent e = float_to_e8m0(amax * f32(1 / fp8_max)), the product rounded
//     UP to a power of two (NaN -> 255, +-inf -> 254, 0 and subnormals up to 2^-127 -> 0, a normal
//     rounding past 254 saturates at 254); scale = 2^(127 - e) as TE's exp2f_rcp computes it: 1
//     for e = 0 and 0 for e = 254; scale_inv = 2^(e - 127), what the GEMM reads from the E8M0 code.
//   kBlockwise (TE's Float8BlockScaling with its default power-of-two scales): 1 x 128 blocks for
//     activations and gradients, 128 x 128 for weights; scale = fp8_max / amax (f32 division)
//     with its mantissa cleared (rounded down to a power of two); 1 for an amax of 0, inf or NaN;
//     an infinite quotient takes the input dtype's largest value, which rounds down to 2^127 for
//     f32 and bf16 alike; scale_inv = 1 / scale.
enum class Fp8BlockRule : uint8_t { kMxfp8, kBlockwise };
struct Fp8BlockScale {
  float scale, scale_inv;
};
Fp8BlockScale fp8_block_scale(float amax, Fp8BlockRule rule, Fp8Format f);
const char* fp8_block_rule_name(Fp8BlockRule rule);  // "mxfp8", "blockwise"

}  // namespace megatron
